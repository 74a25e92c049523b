//! Wiring: [`serve`] binds the socket, loads state, scans the lock dirs, runs every task,
//! and stops gracefully (no diff left unanswered) when the shutdown token fires.

use crate::config::Config;
use crate::frontdoor;
use crate::lockdir::{self, LockDirCommand};
use crate::registry::Registry;
use crate::session::Control;
use crate::state::StateStore;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The socket could not be set up (already running, unsafe dir, …).
    #[error(transparent)]
    Socket(#[from] frontdoor::socket::SocketError),
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

/// A handle to reconfigure a running daemon (SIGHUP).
#[derive(Clone)]
pub struct Handle {
    reg: Arc<Registry>,
    lockdir: mpsc::UnboundedSender<LockDirCommand>,
}

impl Handle {
    /// Applies a new config: lock dirs, health and timeout settings (sessions stay connected).
    pub async fn reload(&self, config: Config) {
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
}

/// Runs the broker until `shutdown` is cancelled. `on_ready` is called once the socket is
/// bound, the state loaded and every lock dir listed once.
pub async fn serve(
    config: Config,
    shutdown: CancellationToken,
    on_ready: impl FnOnce(Ready, Handle),
) -> Result<(), ServeError> {
    let config = Arc::new(config);
    let socket = config.socket_path();
    let record = config.running_record();
    // One daemon per user: held until we return, whatever socket path another would pick.
    let _user_claim = frontdoor::socket::claim_user(&config.state_dir(), &socket, &record)?;
    // Held until we return: no second daemon can claim this socket meanwhile.
    let mut claim_guard = None;
    let listener = match frontdoor::socket::inherited() {
        Some(l) => {
            tracing::info!(socket = %socket.display(), "using the socket passed by the service manager");
            l
        }
        None => {
            let claim = frontdoor::socket::claim(&socket)?;
            let l = frontdoor::socket::bind(&socket).await?;
            claim_guard = Some(claim);
            l
        }
    };
    let state = StateStore::load(&config.state_dir());
    let state_file = state.path().to_path_buf();
    let reg = Registry::new(
        config.clone(),
        state,
        socket.clone(),
        CancellationToken::new(),
    );

    // Every task below runs on the registry's tracker and stops on its tokens; the stop
    // order at the end of this function is the only place they are stopped.
    let tasks = &reg.tracker;
    let (ev_tx, mut ev_rx) = mpsc::unbounded_channel();
    let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
    let (scanned_tx, scanned_rx) = oneshot::channel();
    tasks.spawn(lockdir::watch(
        config.lock_dirs(),
        ev_tx,
        cmd_rx,
        Duration::from_millis(config.rescan_interval_ms.max(100)),
        scanned_tx,
        reg.cancel.clone(),
    )?);
    // The first scan is admitted as one batch: every editor's id is decided knowing all the
    // others, never by the order in which the dirs were listed.
    let _ = scanned_rx.await;
    let mut first = Vec::new();
    while let Ok(ev) = ev_rx.try_recv() {
        first.push(ev);
    }
    reg.apply_batch(first);
    // Ends when the watcher does (it drops the sender).
    tasks.spawn(supervise(reg.clone(), ev_rx));

    if config.compat.enabled {
        let compat_dir = config.compat_dir();
        if config.lock_dirs().iter().any(|d| d.path == compat_dir) {
            tracing::warn!(dir = %compat_dir.display(), "the compat dir is also watched as a lock dir (is PI_IDE_LOCK_DIR exported to the broker or your editors?); set it for pi only, e.g. `PI_IDE_LOCK_DIR=~/.pi/ide-broker pi`");
        }
        tasks.spawn(frontdoor::compat::run(reg.clone(), config.compat_dir()));
    }
    if config.gemini.enabled {
        tasks.spawn(frontdoor::gemini::run(
            reg.clone(),
            config.gemini_dir(),
            config.qwen_dir(),
        ));
    }
    let reg_save = reg.clone();
    tasks.spawn(async move { reg_save.state.saver(&reg_save.cancel).await });
    tasks.spawn(frontdoor::native::serve(listener, reg.clone()));

    // Clients whose environment points elsewhere (no XDG_RUNTIME_DIR) find us through this.
    let running = serde_json::json!({"socket": socket, "pid": std::process::id()});
    if let Err(e) = crate::state::write_atomic_unsynced(&record, running.to_string().as_bytes()) {
        tracing::warn!(file = %record.display(), error = %e, "cannot record the running daemon; clients with another environment may not find it");
    }
    tracing::info!(socket = %socket.display(), state = %state_file.display(), "pi-ide-broker ready");
    on_ready(
        Ready {
            socket: socket.clone(),
            state_file,
        },
        Handle {
            reg: reg.clone(),
            lockdir: cmd_tx,
        },
    );

    shutdown.cancelled().await;
    tracing::info!("stopping");
    // The stop order:
    // 1. the doors stop accepting, so no session arrives while the others are told;
    reg.accepting.cancel();
    // 2. every pending diff is answered (an agent that sees a closed socket mid-diff would
    //    write the edit unreviewed) and every session is told why it is detached;
    for e in reg.editors() {
        e.reject_pending_diffs("broker is shutting down");
    }
    for s in reg.sessions() {
        let _ = s
            .control
            .send(Control::Detached("broker is shutting down".into()));
    }
    // 3. everything else stops: links drain what they owe the editor, sessions flush and
    //    close, the watcher, its supervisor, the saver (between writes) and the service pings;
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
    // 4. the state is saved once more, with no saver left to race;
    if let Err(e) = reg.state.save() {
        tracing::warn!(error = %e, "cannot write state file on shutdown");
    }
    // 5. the socket and the running record go, then the claims (on return).
    let _ = std::fs::remove_file(&socket);
    let _ = std::fs::remove_file(&record);
    drop(claim_guard);
    tracing::info!("stopped");
    Ok(())
}

/// Applies lock dir events to the registry, a burst at a time, until the watcher stops.
async fn supervise(reg: Arc<Registry>, mut events: mpsc::UnboundedReceiver<lockdir::LockEvent>) {
    while let Some(ev) = events.recv().await {
        let mut batch = vec![ev];
        while let Ok(more) = events.try_recv() {
            batch.push(more);
        }
        reg.apply_batch(batch);
    }
}
