//! The broker's wiring: `serve` starts every task and holds the one stop order.
//!
//! [`serve`] binds the socket, loads state, scans the lock dirs, runs every task, and stops
//! gracefully (no diff left unanswered) when the shutdown token fires; `sd_notify` is what
//! the `daemon` command tells a service manager. Uses every layer below the commands.

pub(crate) mod own_binary;
pub(crate) mod sd_notify;

use crate::frontdoor;
use crate::registry::lifecycle::watch::LockDirCommand;
use crate::registry::state::StateStore;
use crate::registry::Registry;
use crate::session::Control;
use crate::sys::config::Config;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// Why the daemon could not start: this layer's one error type.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The socket could not be set up (already running, unsafe dir, …).
    #[error(transparent)]
    Socket(#[from] crate::platform::Error),
    /// The file watcher could not start.
    #[error("cannot start the lock dir watcher: {0}")]
    Watch(#[from] notify::Error),
}

/// What a running daemon tells its starter once it is ready.
#[derive(Clone, Debug)]
pub struct Ready {
    /// The native socket.
    pub socket: PathBuf,
    /// The state file.
    pub state_file: PathBuf,
}

/// A handle to reconfigure a running daemon (SIGHUP) or hand it over to its successor.
#[derive(Clone)]
pub struct Handle {
    reg: Arc<Registry>,
    lockdir: mpsc::UnboundedSender<LockDirCommand>,
    /// The listening socket, kept to hand over (none on Windows).
    kept: Option<Arc<crate::platform::handover::Kept>>,
    /// Set once a successor runs and this daemon steps down for it: the socket and the
    /// running record are the successor's then, not removed at the stop.
    handed_over: Arc<AtomicBool>,
}

/// How long a successor may take to say it runs before the handover is given up.
const SUCCESSOR_STARTS_WITHIN: Duration = Duration::from_secs(10);
/// How long a successor waits for the daemon it replaces to let go, beyond that daemon's own
/// shutdown timeout.
const TAKE_OVER_SLACK: Duration = Duration::from_secs(10);
/// What sessions are told at a stop; the pi extension stays quiet on "shutting down" (the
/// link comes back), and says "Reconnected" when it is attached again.
const STOPPING: &str = "broker is shutting down";

impl Handle {
    /// Applies a new config: lock dirs, health and timeout settings (sessions stay connected).
    pub async fn reload(&self, config: Config) {
        let config = frontdoor::with_door_lock_dirs(config);
        let dirs = config.lock_dirs();
        self.reg.set_config(Arc::new(config));
        let (tx, rx) = oneshot::channel();
        if self.lockdir.send(LockDirCommand::SetDirs(dirs, tx)).is_ok() {
            let _ = rx.await;
        }
    }

    /// The registry, for status and tests.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.reg
    }

    /// Starts `exe` with this daemon's own arguments to take over its listening socket, and
    /// waits until it says it runs (its pid): the caller then stops this daemon, which leaves
    /// the socket listening for it. An error says why the successor cannot take over; this
    /// daemon then serves on as before.
    pub async fn hand_over(&self, exe: &std::path::Path) -> Result<u32, String> {
        let kept = self
            .kept
            .as_ref()
            .ok_or("this daemon's socket cannot be handed over here")?;
        let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
        let successor = crate::platform::handover::start_successor(exe, &args, kept)
            .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
        let pid = successor.started(SUCCESSOR_STARTS_WITHIN).await?;
        self.handed_over.store(true, Ordering::Release);
        Ok(pid)
    }
}

/// Runs the broker until `shutdown` is cancelled. `on_ready` is called once the socket is
/// bound, the state loaded and every lock dir listed once.
pub async fn serve(
    config: Config,
    shutdown: CancellationToken,
    on_ready: impl FnOnce(Ready, Handle),
) -> Result<(), Error> {
    serve_with(config, &[], shutdown, on_ready).await
}

/// [`serve`], with `doors` plugged in beside the built-in ones (`frontdoor::DOORS`): how a
/// door made outside this crate (a test's) runs in the daemon. Each runs when its `enabled`
/// says so.
pub async fn serve_with(
    config: Config,
    doors: &[Arc<dyn frontdoor::plugin::AgentDoor>],
    shutdown: CancellationToken,
    on_ready: impl FnOnce(Ready, Handle),
) -> Result<(), Error> {
    let config = Arc::new(frontdoor::with_door_lock_dirs(config));
    let socket = config.socket_path();
    let record = config.running_record();
    // One daemon per user, and one per socket: both claims held until we return.
    let (_user_claim, listener, claim) = claim_and_listen(&config, &socket, &record).await?;
    let kept = crate::platform::handover::keep(&listener).map(Arc::new);
    let handed_over = Arc::new(AtomicBool::new(false));
    let remotes = bind_remotes(&config, &socket).await;
    if let crate::platform::peer::Place::Unreadable(why) = crate::platform::peer::own_place() {
        tracing::warn!("cannot read the broker's own namespaces ({why}): a container on the main socket cannot be told from a local process; give containers a [[remote]]'s socket");
    }
    // A flood must meet the agents' connection budgets (`registry::limits`), not EMFILE.
    if let Some(fds) = crate::platform::rlimit::raise_open_files() {
        tracing::debug!(open_files = fds, "open-files limit");
    }
    let state = StateStore::load(&config.state_dir());
    let state_file = state.path().to_path_buf();
    let reg = Registry::new(
        config.clone(),
        state,
        socket.clone(),
        CancellationToken::new(),
    );
    // Every task runs on the registry's tracker and stops on its tokens; [`stop`] is the only
    // place they are stopped.
    let lockdir = reg.watch_lock_dirs().await?;
    start_doors(&reg, doors, listener, remotes);
    // Clients whose environment points elsewhere (no XDG_RUNTIME_DIR) find us through this.
    let running = serde_json::json!({"socket": socket, "pid": std::process::id()});
    if let Err(e) =
        crate::registry::state::write_atomic_unsynced(&record, running.to_string().as_bytes())
    {
        tracing::warn!(file = %record.display(), error = %e, "cannot record the running daemon; clients with another environment may not find it");
    }
    tracing::info!(socket = %socket.display(), state = %state_file.display(), "pi-ide-broker ready");
    let ready = Ready {
        socket: socket.clone(),
        state_file,
    };
    on_ready(
        ready,
        Handle {
            reg: reg.clone(),
            lockdir,
            kept,
            handed_over: handed_over.clone(),
        },
    );
    shutdown.cancelled().await;
    let handing_over = handed_over.load(Ordering::Acquire);
    let leaving = if handing_over {
        Leaving::ToSuccessor
    } else {
        Leaving::Alone {
            // A socket the service manager passed is its own.
            socket: claim.is_some().then_some(socket.as_path()),
            record: &record,
        }
    };
    step_down(&reg, &config, leaving).await;
    drop(claim);
    tracing::info!("stopped");
    Ok(())
}

/// How a daemon stops: for a successor that took over its socket, or leaving no one.
enum Leaving<'a> {
    /// Its upgraded binary serves on the socket and writes the running record.
    ToSuccessor,
    /// No successor: the running record goes, and the socket too when it is ours (one the
    /// service manager passed is left listening for the next start).
    Alone {
        socket: Option<&'a std::path::Path>,
        record: &'a std::path::Path,
    },
}

/// The daemon's last steps, before its claims go (which a successor waits for). Leaving no
/// one, the socket and the running record go first: the listening socket stays open to the
/// end (its duplicate is kept for a handover), and a client dialling it while the stop runs
/// would wait in its backlog for nobody; with the path gone it is told at once that no
/// daemon runs. A daemon it starts before this one let go of its claim exits ("already
/// running"), and the pi extension starts it again once that one did.
async fn step_down(reg: &Arc<Registry>, config: &Config, leaving: Leaving<'_>) {
    let why = match leaving {
        Leaving::ToSuccessor => format!("{STOPPING}: handing over to its upgraded binary"),
        Leaving::Alone { socket, record } => {
            if let Some(socket) = socket {
                let _ = std::fs::remove_file(socket);
            }
            let _ = std::fs::remove_file(record);
            STOPPING.to_string()
        }
    };
    stop(reg, config, &why).await;
    remove_remote_sockets(reg, config);
}

/// The per-user claim, the listening socket and the socket's claim (none for a socket the
/// service manager passed).
type Claimed = (
    crate::platform::local::Claim,
    crate::platform::local::Listener,
    Option<crate::platform::local::Claim>,
);

/// [`Claimed`]: taken over from the daemon this binary replaces, or taken and bound here.
async fn claim_and_listen(
    config: &Config,
    socket: &std::path::Path,
    record: &std::path::Path,
) -> Result<Claimed, Error> {
    match crate::platform::handover::taken() {
        Some(taken) => take_over(taken, config, socket).await,
        None => {
            let user = crate::platform::local::claim_user(&config.state_dir(), socket, record)?;
            let (listener, claim) = listen(socket).await?;
            Ok((user, listener, claim))
        }
    }
}

/// A successor's start: tells the daemon it replaces that it runs, waits for that daemon's
/// claims (it lets go once its stop order is done and its state saved), then serves on the
/// listening socket it inherited, which never stopped listening: clients that came meanwhile
/// wait in its backlog.
async fn take_over(
    mut taken: crate::platform::handover::Taken,
    config: &Config,
    socket: &std::path::Path,
) -> Result<Claimed, Error> {
    tracing::info!(
        from = taken.from,
        "taking over the socket from the daemon this binary replaces"
    );
    taken.tell_started();
    let wait = Duration::from_millis(config.shutdown_timeout_ms) + TAKE_OVER_SLACK;
    let user =
        crate::platform::local::claim_user_when_free(&config.state_dir(), socket, wait).await?;
    let claim = crate::platform::local::claim_when_free(socket, wait).await?;
    let listener = taken.listener().map_err(crate::platform::Error::Io)?;
    Ok((user, listener, Some(claim)))
}

/// The listening socket: the one the service manager passed, or ours, bound with its claim.
async fn listen(
    socket: &std::path::Path,
) -> Result<
    (
        crate::platform::local::Listener,
        Option<crate::platform::local::Claim>,
    ),
    Error,
> {
    if let Some(l) = crate::platform::local::inherited() {
        tracing::info!(socket = %socket.display(), "using the socket passed by the service manager");
        return Ok((l, None));
    }
    let claim = crate::platform::local::claim(socket)?;
    let l = crate::platform::local::bind(socket).await?;
    Ok((l, Some(claim)))
}

/// The plugged doors (those the config turns on), the state saver, the native door and each
/// remote's socket (the same door, with agent rights only).
fn start_doors(
    reg: &Arc<Registry>,
    extra: &[Arc<dyn frontdoor::plugin::AgentDoor>],
    listener: crate::platform::local::Listener,
    remotes: Vec<(String, crate::platform::local::Listener)>,
) {
    let tasks = &reg.tracker;
    let builtin = frontdoor::DOORS.iter().copied();
    for door in builtin.chain(extra.iter().map(|d| &**d)) {
        if door.enabled(&reg.config()) {
            tasks.spawn(door.run(reg.clone()));
        }
    }
    let reg_save = reg.clone();
    tasks.spawn(async move { reg_save.state.saver(&reg_save.cancel).await });
    let seen = Arc::new(frontdoor::rights::Seen::default());
    tasks.spawn(frontdoor::native::serve(
        listener,
        reg.clone(),
        frontdoor::rights::Socket::Main,
        seen.clone(),
    ));
    for (name, l) in remotes {
        tasks.spawn(frontdoor::native::serve(
            l,
            reg.clone(),
            frontdoor::rights::Socket::Remote(name),
            seen.clone(),
        ));
    }
}

/// Each `[[remote]]`'s socket, bound in a private dir of its own (0700, the socket 0600) beside
/// the main socket. One that cannot be bound is logged and left out: the others and the main
/// socket still serve.
async fn bind_remotes(
    config: &Config,
    main: &std::path::Path,
) -> Vec<(String, crate::platform::local::Listener)> {
    let mut bound = Vec::new();
    if cfg!(windows) && !config.remote_names().is_empty() {
        tracing::warn!("[[remote]] sockets are not served on Windows (their path maps are POSIX paths); see docs/windows.md");
        return bound;
    }
    for name in config.remote_names() {
        let path = Config::remote_socket(main, &name);
        let listener = match path.parent() {
            Some(dir) => match crate::platform::local::secure_dir(dir) {
                Ok(()) => crate::platform::local::bind(&path).await,
                Err(e) => Err(e),
            },
            None => continue,
        };
        match listener {
            Ok(l) => {
                tracing::info!(remote = %name, socket = %path.display(), "listening for the remote (agent rights only)");
                bound.push((name, l));
            }
            Err(e) => {
                tracing::error!(remote = %name, error = %e, "cannot listen on the remote's socket; its agents cannot connect until this is fixed and the broker restarted")
            }
        }
    }
    bound
}

/// Removes the remote sockets this configuration binds (at stop: they name no daemon then).
fn remove_remote_sockets(reg: &Registry, config: &Config) {
    for name in config.remote_names() {
        let _ = std::fs::remove_file(Config::remote_socket(&reg.socket, &name));
    }
}

/// The stop order, written once:
/// 1. the doors stop accepting, so no session arrives while the others are told;
/// 2. every pending diff is answered (an agent that sees a closed socket mid-diff would write
///    the edit unreviewed) and every session is told why it is detached;
/// 3. everything else stops: links drain what they owe the editor, sessions flush and close,
///    the watcher, its supervisor, the saver (between writes) and the service pings;
/// 4. the state is saved once more, with no saver left to race.
async fn stop(reg: &Arc<Registry>, config: &Config, why: &str) {
    tracing::info!("stopping");
    reg.accepting.cancel();
    for e in reg.editors() {
        e.reject_pending_diffs(why);
    }
    for s in reg.sessions() {
        let _ = s.control.send(Control::Detached(why.into()));
    }
    reg.cancel.cancel();
    reg.tracker.close();
    let limit = Duration::from_millis(config.shutdown_timeout_ms);
    if tokio::time::timeout(limit, reg.tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            timeout_ms = config.shutdown_timeout_ms,
            "some tasks did not stop in time"
        );
    }
    if let Err(e) = reg.state.save() {
        tracing::warn!(error = %e, "cannot write state file on shutdown");
    }
}
