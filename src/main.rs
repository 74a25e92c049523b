//! The `pi-ide-broker` command: parses arguments and wires signals; the work is in the library.

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use pi_ide_broker::{client, config::Config, control, daemon, logging, service};
use std::path::PathBuf;
use std::process::ExitCode;
use tokio_util::sync::CancellationToken;

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
struct Cli {
    /// Config file (TOML). A missing file means defaults.
    /// [default: ~/.config/pi-ide-broker/config.toml]
    #[arg(long, global = true, value_name = "FILE", env = "PI_IDE_BROKER_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

/// The version and the commit it was built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("PI_IDE_BROKER_COMMIT"),
    ")"
);

#[derive(Subcommand)]
enum Command {
    /// Run the broker in the foreground (what the systemd/launchd service runs).
    ///
    /// Watches the lock dirs (~/.pi/ide, ~/.claude/ide by default), links to every editor,
    /// and serves agent sessions on the Unix socket. SIGTERM/SIGINT stop it gracefully;
    /// SIGHUP reloads the config.
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
        /// The protocol dialect the client speaks.
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
    /// The `ssh -R` forward of this socket, the `docker run -v` bind mount, the devcontainer.json
    /// mount, and the PI_IDE_BROKER_SOCKET to set on the other side; the [[remote]] path maps
    /// configured. See the README, "Agents in containers, WSL and over SSH".
    Remote {
        /// The socket path on the other side.
        #[arg(long, value_name = "PATH", default_value = "/tmp/pi-ide-broker.sock")]
        remote_socket: PathBuf,
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
    /// Stop the running daemon gracefully (SIGTERM), however it was started.
    ///
    /// Pending diffs are answered and sessions told, as on any graceful stop; waits until
    /// nothing answers on the socket. A user service starts it again at the next login
    /// (`service uninstall` removes the service). Nothing running is not an error.
    Stop,
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
enum ManagerArg {
    /// systemd user units (Linux).
    Systemd,
    /// launchd LaunchAgents (macOS).
    Launchd,
}

#[derive(Subcommand)]
enum ServiceAction {
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

async fn doctor(
    config_path: Option<PathBuf>,
    cwd: Option<PathBuf>,
    session: Option<String>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let cwd = match cwd {
        Some(c) => std::path::absolute(&c).with_context(|| format!("--cwd {}", c.display()))?,
        None => std::env::current_dir().context("cannot read the current directory; pass --cwd")?,
    };
    let report = pi_ide_broker::doctor::run(&pi_ide_broker::doctor::Options {
        config_path,
        cwd,
        key: session,
    })
    .await;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", pi_ide_broker::doctor::render(&report));
    }
    Ok(if report.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `setup` (or its undo), then doctor's verdict after a setup; exit status 1 when a step failed.
async fn setup(
    opts: &pi_ide_broker::setup::Options,
    config: &Config,
    config_path: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    let env = pi_ide_broker::setup::Env::from_process(config, config_path.clone());
    let lines = pi_ide_broker::setup::run(opts, &env);
    if !opts.undo {
        println!("\ndoctor:");
        let cwd = report_cwd(&env);
        let report = pi_ide_broker::doctor::run(&pi_ide_broker::doctor::Options {
            config_path,
            cwd,
            key: None,
        })
        .await;
        print!("{}", pi_ide_broker::doctor::render(&report));
        if !report.ok {
            println!("(The route is checked for {}: once an editor has a project open, `pi-ide-broker doctor` there says whether an agent reaches it.)", report_cwd(&env).display());
        }
    }
    Ok(if pi_ide_broker::setup::all_ok(&lines) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The directory setup's doctor run explains the route for: the current one.
fn report_cwd(env: &pi_ide_broker::setup::Env) -> PathBuf {
    std::env::current_dir().unwrap_or_else(|_| env.home.clone())
}

/// Says that no daemon answers and how to start one; exit status 3.
fn not_running(socket: &str) -> ExitCode {
    // Offer the service only where a service manager would take it (doctor says the same).
    let env = pi_ide_broker::setup::Env::from_process(&Config::default(), None);
    let service = match pi_ide_broker::setup::no_service_manager(&env) {
        None => ", or install the service with `pi-ide-broker service install`",
        Some(_) => " (no user service manager answers here, so there is no service to install)",
    };
    eprintln!(
        "pi-ide-broker is not running (nothing answers on {socket}).\nStart it with `pi-ide-broker daemon`{service}."
    );
    ExitCode::from(3)
}

/// `stop`: asks the daemon that answers on the socket for its pid, sends it SIGTERM (the
/// graceful stop: pending diffs answered, sessions told), and waits until nothing answers.
async fn stop_cmd(config: &Config) -> anyhow::Result<ExitCode> {
    let socket = config.socket_to_dial();
    let status = match client::get_json(&socket, "/v1/status").await {
        Ok(s) => s,
        Err(client::ClientError::NotRunning(s)) => {
            println!("no daemon is running (nothing answers on {s}); nothing to stop");
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => return Err(e.into()),
    };
    let pid = status["broker"]["pid"]
        .as_i64()
        .and_then(|p| i32::try_from(p).ok())
        .and_then(rustix::process::Pid::from_raw)
        .context("the daemon's status names no pid; is it another version? stop it with `kill`")?;
    // Only a daemon this machine runs, as its own record says: a socket forwarded from
    // elsewhere (ssh, a container) reports a pid of another machine or pid namespace.
    let record = config.running_record();
    let recorded = std::fs::read_to_string(&record)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["pid"].as_i64());
    if recorded != Some(i64::from(pid.as_raw_nonzero().get())) {
        anyhow::bail!(
            "the daemon answering on {} (pid {}) is not the one {} records: it runs elsewhere (a forwarded socket?); stop it where it runs",
            socket.display(),
            pid.as_raw_nonzero(),
            record.display()
        );
    }
    rustix::process::kill_process(pid, rustix::process::Signal::TERM)
        .with_context(|| format!("cannot signal the daemon (pid {})", pid.as_raw_nonzero()))?;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while tokio::time::Instant::now() < deadline {
        if matches!(
            client::get_json(&socket, "/v1/status").await,
            Err(client::ClientError::NotRunning(_))
        ) {
            println!("stopped the daemon (pid {})", pid.as_raw_nonzero());
            let home = pi_ide_broker::config::home_dir();
            let env = pi_ide_broker::setup::Env::from_process(config, None);
            let unit = service::unit(
                service::Manager::here(),
                &env.exe,
                None,
                &home,
                &env.config_home,
            );
            if unit.path.exists() {
                println!("the user service starts it again at the next login; `pi-ide-broker service uninstall` removes it");
            }
            return Ok(ExitCode::SUCCESS);
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    anyhow::bail!(
        "the daemon (pid {}) is still answering 20 s after SIGTERM; see its log (`pi-ide-broker paths`), or `kill -9 {}`",
        pid.as_raw_nonzero(),
        pid.as_raw_nonzero()
    )
}

/// `status --watch`: the table redrawn on every change in a terminal (alternate screen, left
/// clean on Ctrl-C), plain lines otherwise.
async fn watch(socket: &std::path::Path) -> anyhow::Result<ExitCode> {
    use std::io::{IsTerminal, Write};
    let tty = std::io::stdout().is_terminal();
    let mut prev: Option<control::Status> = None;
    if tty {
        print!("\x1b[?1049h");
    }
    let follow = client::follow_events(socket, |line| {
        let Ok(next) = serde_json::from_value::<control::Status>(line["status"].clone()) else {
            return;
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let mut out = std::io::stdout().lock();
        if tty {
            let _ = write!(
                out,
                "\x1b[2J\x1b[H{}\n(watching; Ctrl-C to quit)\n",
                control::render(&next, now)
            );
        } else {
            match &prev {
                None => {
                    let ready = next
                        .editors
                        .iter()
                        .filter(|e| e.state == pi_ide_broker::editor::LinkState::Ready)
                        .count();
                    let _ = writeln!(
                        out,
                        "watching pi-ide-broker {} (pid {}): {} editors ({ready} ready), {} sessions",
                        next.broker.version,
                        next.broker.pid,
                        next.editors.len(),
                        next.sessions.len()
                    );
                }
                Some(p) => {
                    for l in control::changes(p, &next) {
                        let _ = writeln!(out, "{l}");
                    }
                }
            }
        }
        let _ = out.flush();
        prev = Some(next);
    });
    let result = tokio::select! {
        r = follow => r,
        _ = tokio::signal::ctrl_c() => Ok(()),
    };
    if tty {
        print!("\x1b[?1049l");
        let _ = std::io::stdout().flush();
    }
    match result {
        Ok(()) => {
            if !tty {
                println!("pi-ide-broker stopped");
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(client::ClientError::NotRunning(s)) => Ok(not_running(&s)),
        Err(e) => Err(e.into()),
    }
}

fn main() -> ExitCode {
    pi_ide_broker::allocator::keep_freed_frames();
    let cli = Cli::parse();
    // One thread for everything: a call crosses tasks (session → link → session), and on a
    // multi-threaded runtime every such wake-up is a futex and a context switch when the
    // other worker sleeps. The broker's work per frame is microseconds (no blocking calls in
    // its tasks), so one thread serves hundreds of sessions with less CPU per call
    // (`cargo bench` measures it against a bare relay). PI_IDE_BROKER_THREADS=N (N > 1) asks
    // for a multi-threaded runtime instead.
    let threads = std::env::var("PI_IDE_BROKER_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(1);
    let built = if threads > 1 {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            // Look at the sockets every 8 task polls (tokio's default is 61): with dozens of
            // busy sessions a frame waiting in the kernel otherwise waits behind them all.
            .event_interval(8)
            .enable_all()
            .build()
    };
    let runtime = match built {
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
    // doctor reads the config itself: a broken file is one of the things it reports.
    if let Command::Doctor { cwd, session, json } = cli.command {
        let path = cli.config.clone().or_else(Config::default_path);
        return doctor(path, cwd, session, json).await;
    }
    let (config, config_path) = load_config(&cli.config)?;
    match cli.command {
        Command::Daemon => run_daemon(config, config_path).await,
        Command::Mcp {
            cwd,
            session,
            dialect,
            remote,
            no_spawn,
        } => mcp_cmd(config, config_path, cwd, session, dialect, remote, no_spawn).await,
        Command::Service { action, manager } => service_cmd(
            action,
            match manager {
                None => service::Manager::here(),
                Some(ManagerArg::Systemd) => service::Manager::Systemd,
                Some(ManagerArg::Launchd) => service::Manager::Launchd,
            },
        ),
        Command::Setup {
            write,
            dry_run,
            undo,
            pi_source,
        } => {
            let opts = pi_ide_broker::setup::Options {
                write,
                dry_run,
                undo,
                pi_source,
            };
            setup(&opts, &config, config_path).await
        }
        Command::Remote { remote_socket } => Ok(remote_cmd(&config, &remote_socket)),
        Command::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "pi-ide-broker", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        Command::Man => man_cmd(),
        // Handled above, before the config is loaded.
        Command::Doctor { .. } => Ok(ExitCode::FAILURE),
        Command::Paths { json } => Ok(paths_cmd(&config, config_path, json)),
        Command::Status { watch: true, .. } => watch(&config.socket_to_dial()).await,
        Command::Status { json, .. } => status_cmd(&config, json).await,
        Command::Stop => stop_cmd(&config).await,
    }
}

/// `mcp`: the stdio door for MCP clients (Claude Code, Codex, pi's MCP adapter).
async fn mcp_cmd(
    config: Config,
    config_path: Option<PathBuf>,
    cwd: Option<PathBuf>,
    session: Option<String>,
    dialect: String,
    remote: Option<String>,
    no_spawn: bool,
) -> anyhow::Result<ExitCode> {
    // stdout is the protocol: logs go to stderr, quiet by default.
    let mut quiet = config.clone();
    if std::env::var_os("RUST_LOG").is_none() {
        quiet.log = "warn".into();
    }
    logging::init(&quiet);
    let cwd = match cwd {
        Some(c) => std::path::absolute(&c).with_context(|| format!("--cwd {}", c.display()))?,
        None => std::env::current_dir().context("cannot read the current directory; pass --cwd")?,
    };
    let opts = pi_ide_broker::frontdoor::stdio::Options {
        socket: config.socket_to_dial(),
        cwd: cwd.display().to_string(),
        key: Some(session.unwrap_or_else(pi_ide_broker::frontdoor::stdio::default_key)),
        dialect,
        spawn: !no_spawn,
        config: config_path.filter(|p| p.exists()),
        log_dir: config.state_dir(),
        max_line: config.max_frame_bytes,
        remote,
    };
    let stdin = tokio::io::BufReader::new(tokio::io::stdin());
    match pi_ide_broker::frontdoor::stdio::run(opts, stdin, tokio::io::stdout()).await {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(pi_ide_broker::frontdoor::stdio::StdioError::Reported) => Ok(ExitCode::FAILURE),
        Err(e) => Err(e.into()),
    }
}

/// `remote`: how to hand this broker's socket to an agent over SSH or in a container.
fn remote_cmd(config: &Config, remote_socket: &std::path::Path) -> ExitCode {
    let here = config.socket_to_dial();
    let there = remote_socket.display();
    println!("# This broker's socket: {}", here.display());
    println!("# Over SSH (the agent runs on the remote host; this machine has the editor):");
    println!("ssh -R {there}:{} user@devbox", here.display());
    println!("#   then, on devbox: export PI_IDE_BROKER_SOCKET={there}");
    println!("#   (sshd needs StreamLocalBindUnlink yes to reuse the path)");
    println!("# Docker (the agent runs in a container):");
    println!(
        "docker run -v {}:{there} -e PI_IDE_BROKER_SOCKET={there} …",
        here.display()
    );
    println!("# devcontainer.json:");
    println!(
        "\"mounts\": [\"source={},target={there},type=bind\"], \"containerEnv\": {{\"PI_IDE_BROKER_SOCKET\": \"{there}\"}}",
        here.display()
    );
    println!("# A container's root is another uid: allow it with allow_uids = [0] in the config.");
    if config.remote.is_empty() {
        println!("# No [[remote]] path maps yet; add one per mounted folder, e.g.:");
        println!("#   [[remote]]\n#   name = \"box\"\n#   agent = \"/workspaces/app\"\n#   host = \"/home/me/src/app\"");
    } else {
        for r in &config.remote {
            println!(
                "# remote {:?}: {} (agent) = {} (here)",
                r.name,
                r.agent.display(),
                r.host.display()
            );
        }
        println!("# Agents say which remote they are: pi-ide-broker mcp --remote NAME, or remote=NAME on /v1/session.");
    }
    ExitCode::SUCCESS
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

/// `paths`: where the socket, state, log and config are.
fn paths_cmd(config: &Config, config_path: Option<PathBuf>, json: bool) -> ExitCode {
    let paths = serde_json::json!({
        "socket": config.socket_to_dial(),
        "state_dir": config.state_dir(),
        "log": config.state_dir().join("daemon.log"),
        "config": config_path,
    });
    if json {
        println!("{paths}");
    } else if let Some(map) = paths.as_object() {
        for (k, v) in map {
            println!("{k}: {}", v.as_str().unwrap_or("-"));
        }
    }
    ExitCode::SUCCESS
}

/// `status`: the running daemon's editors, sessions and routes, as a table or JSON.
async fn status_cmd(config: &Config, json: bool) -> anyhow::Result<ExitCode> {
    let socket = config.socket_to_dial();
    match client::get_json(&socket, "/v1/status").await {
        Ok(status) => {
            if json {
                println!("{}", serde_json::to_string_pretty(&status)?);
            } else {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0);
                let typed: control::Status = serde_json::from_value(status).context(
                    "the daemon's status is not in the shape this pi-ide-broker reads; is it another version? try `status --json`",
                )?;
                print!("{}", control::render(&typed, now));
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(client::ClientError::NotRunning(s)) => Ok(not_running(&s)),
        Err(e) => Err(e.into()),
    }
}

/// Where the service manager writes the log to a file (launchd), nothing else rotates it: cut
/// it back every 10 min, until the stop (as every other task of the daemon ends).
async fn trim_log_until(stop: CancellationToken) {
    let mut every = tokio::time::interval(std::time::Duration::from_secs(600));
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = every.tick() => {
                if let Err(e) = logging::trim_stderr_log() {
                    tracing::debug!(error = %e, "cannot check the log file's size");
                }
            }
        }
    }
}

async fn run_daemon(config: Config, config_path: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let logs = logging::init(&config);
    // The pi extension setup wrote, brought to this binary's version (a no-op when it is).
    pi_ide_broker::setup::extension::refresh(&config.data_dir());
    let shutdown = CancellationToken::new();
    tokio::spawn(trim_log_until(shutdown.clone()));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    let (handle_tx, mut handle_rx) = tokio::sync::oneshot::channel();
    let stop = shutdown.clone();
    let serving = tokio::spawn(daemon::serve(config, stop, move |_ready, handle| {
        let _ = handle_tx.send(handle);
    }));
    let mut handle: Option<daemon::Handle> = None;
    // A oneshot must not be polled again once it has completed (with a handle or, when the
    // daemon failed to start, with nothing).
    let mut handle_pending = true;
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
            h = &mut handle_rx, if handle_pending => {
                handle_pending = false;
                handle = h.ok();
                if let Some(h) = &handle {
                    service::announce_ready(h.registry());
                }
            }
            _ = term.recv() => {
                service::announce_stopping();
                shutdown.cancel();
            }
            _ = int.recv() => {
                service::announce_stopping();
                shutdown.cancel();
            }
            _ = hup.recv() => {
                let Some(h) = &handle else { continue };
                service::notify_reloading();
                match &config_path {
                    None => tracing::warn!("SIGHUP: no config file to reload"),
                    Some(path) => match Config::load(path) {
                        Ok(c) => {
                            if let Err(e) = logs.set_filter(&c.log) {
                                tracing::warn!(error = %e, "log filter not changed");
                            }
                            h.reload(c).await;
                            tracing::info!(config = %path.display(), "config reloaded");
                        }
                        Err(e) => tracing::error!(error = %e, "config reload failed; keeping the running config"),
                    },
                }
                let line = service::status_line(h.registry());
                service::notify(&[sd_notify::NotifyState::Ready, sd_notify::NotifyState::Status(&line)]);
            }
        }
    }
}

fn service_cmd(action: ServiceAction, manager: service::Manager) -> anyhow::Result<ExitCode> {
    let bin = std::env::current_exe().context("cannot find this binary's path")?;
    let bin = std::fs::canonicalize(&bin).unwrap_or(bin);
    let home = pi_ide_broker::config::home_dir();
    let config_home = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| home.join(".config"));
    let unit_config = match &action {
        ServiceAction::Install {
            config: Some(c), ..
        } => {
            let c = std::path::absolute(c).with_context(|| format!("--config {}", c.display()))?;
            if !c.exists() {
                anyhow::bail!(
                    "--config {}: no such file; write it first (config.example.toml lists every key)",
                    c.display()
                );
            }
            Some(c)
        }
        _ => None,
    };
    let unit = service::unit(manager, &bin, unit_config.as_deref(), &home, &config_home);
    match action {
        ServiceAction::Install { dry_run, .. } => service_install(manager, &unit, &home, dry_run),
        ServiceAction::Uninstall { dry_run } => service_uninstall(manager, &unit, dry_run),
        ServiceAction::Status => service_status(manager),
    }
}

/// The steps as `--dry-run` prints them.
fn shown(steps: &[service::Step]) -> String {
    steps
        .iter()
        .map(service::Step::shown)
        .collect::<Vec<_>>()
        .join("\n")
}

/// `service install`: the unit written, then the manager's steps.
fn service_install(
    manager: service::Manager,
    unit: &service::UnitFile,
    home: &std::path::Path,
    dry_run: bool,
) -> anyhow::Result<ExitCode> {
    let steps = service::commands(manager, unit, true);
    if dry_run {
        println!(
            "would write {}:\n{}\nwould run:\n{}",
            unit.path.display(),
            unit.content,
            shown(&steps)
        );
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(dir) = unit.path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    if manager == service::Manager::Launchd {
        let logs = home.join("Library/Logs/pi-ide-broker");
        std::fs::create_dir_all(&logs)
            .with_context(|| format!("cannot create {}", logs.display()))?;
    }
    std::fs::write(&unit.path, &unit.content)
        .with_context(|| format!("cannot write {}", unit.path.display()))?;
    println!("wrote {}", unit.path.display());
    run_steps(&steps)
}

/// `service uninstall`: the manager's steps, then the unit removed.
fn service_uninstall(
    manager: service::Manager,
    unit: &service::UnitFile,
    dry_run: bool,
) -> anyhow::Result<ExitCode> {
    let steps = service::commands(manager, unit, false);
    if dry_run {
        println!(
            "would run:\n{}\nwould remove {}",
            shown(&steps),
            unit.path.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let code = run_steps(&steps)?;
    match std::fs::remove_file(&unit.path) {
        Ok(()) => println!("removed {}", unit.path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            println!("{} was not installed", unit.path.display())
        }
        Err(e) => {
            return Err(anyhow::anyhow!(
                "cannot remove {}: {e}",
                unit.path.display()
            ))
        }
    }
    Ok(code)
}

/// `service status`: the service manager's own report, straight to the terminal.
fn service_status(manager: service::Manager) -> anyhow::Result<ExitCode> {
    let argv: Vec<String> = match manager {
        service::Manager::Systemd => [
            "systemctl",
            "--user",
            "status",
            "--no-pager",
            service::SYSTEMD_NAME,
        ]
        .map(String::from)
        .to_vec(),
        service::Manager::Launchd => vec![
            "launchctl".into(),
            "print".into(),
            format!(
                "gui/{}/{}",
                rustix::process::getuid().as_raw(),
                service::LAUNCHD_LABEL
            ),
        ],
    };
    match std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .status()
    {
        Ok(s) if s.success() => Ok(ExitCode::SUCCESS),
        Ok(s) => {
            eprintln!(
                "`{}` says the service is not running ({s}); `pi-ide-broker service install` installs and starts it",
                argv.join(" ")
            );
            Ok(ExitCode::FAILURE)
        }
        Err(_) => {
            eprintln!(
                "{} is not available here; run `{}` where your service manager is",
                argv[0],
                argv.join(" ")
            );
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Runs the service manager's steps; a required one that fails is explained with its fix and
/// the commands left to run by hand.
fn run_steps(steps: &[service::Step]) -> anyhow::Result<ExitCode> {
    match service::run_steps(steps) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err((i, err, fix)) => {
            eprintln!("error: {err}\n{fix}.");
            eprintln!("The commands left, to run by hand once that works:");
            for rest in &steps[i..] {
                eprintln!("  {}", rest.shown());
            }
            Ok(ExitCode::FAILURE)
        }
    }
}
