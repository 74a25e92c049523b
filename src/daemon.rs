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
    let cancel = CancellationToken::new();
    let reg = Registry::new(config.clone(), state, socket.clone(), cancel.clone());

    let (ev_tx, mut ev_rx) = mpsc::unbounded_channel();
    let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
    let (scanned_tx, scanned_rx) = oneshot::channel();
    let watcher = lockdir::spawn(
        config.lock_dirs(),
        ev_tx,
        cmd_rx,
        Duration::from_millis(config.rescan_interval_ms.max(100)),
        scanned_tx,
        cancel.clone(),
    )?;
    // The first scan is admitted as one batch: every editor's id is decided knowing all the
    // others, never by the order in which the dirs were listed.
    let _ = scanned_rx.await;
    let mut first = Vec::new();
    while let Ok(ev) = ev_rx.try_recv() {
        first.push(ev);
    }
    reg.apply_batch(first);
    let reg_sup = reg.clone();
    let supervisor = tokio::spawn(async move {
        while let Some(ev) = ev_rx.recv().await {
            let mut batch = vec![ev];
            while let Ok(more) = ev_rx.try_recv() {
                batch.push(more);
            }
            reg_sup.apply_batch(batch);
        }
    });

    if config.compat.enabled {
        let compat_dir = config.compat_dir();
        if config.lock_dirs().iter().any(|d| d.path == compat_dir) {
            tracing::warn!(dir = %compat_dir.display(), "the compat dir is also watched as a lock dir (is PI_IDE_LOCK_DIR exported to the broker or your editors?); set it for pi only, e.g. `PI_IDE_LOCK_DIR=~/.pi/ide-broker pi`");
        }
        reg.tracker
            .spawn(frontdoor::compat::run(reg.clone(), config.compat_dir()));
    }
    let reg_save = reg.clone();
    let saver = tokio::spawn(async move { reg_save.state.saver().await });
    let accept_stop = CancellationToken::new();
    let reg_native = reg.clone();
    let stop = accept_stop.clone();
    let native = tokio::spawn(async move {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = frontdoor::native::serve(listener, reg_native) => {}
        }
    });

    // Clients whose environment points elsewhere (no XDG_RUNTIME_DIR) find us through this.
    let running = serde_json::json!({"socket": socket, "pid": std::process::id()});
    if let Err(e) = crate::state::write_atomic(&record, running.to_string().as_bytes()) {
        tracing::warn!(file = %record.display(), error = %e, "cannot record the running daemon; clients with another environment may not find it");
    }
    tracing::info!(socket = %socket.display(), state = %state_file.display(), "pi-ide-broker ready");
    let line = crate::service::status_line(&reg);
    crate::service::notify(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status(&line),
    ]);
    reg.tracker.spawn(crate::service::run(reg.clone()));
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
    crate::service::notify(&[
        sd_notify::NotifyState::Stopping,
        sd_notify::NotifyState::Status("stopping"),
    ]);
    tracing::info!("stopping");
    accept_stop.cancel();
    let _ = native.await;
    // An agent that sees a closed socket mid-diff would write the edit unreviewed.
    for e in reg.editors() {
        e.reject_pending_diffs("broker is shutting down");
    }
    for s in reg.sessions() {
        let _ = s
            .control
            .send(Control::Detached("broker is shutting down".into()));
    }
    cancel.cancel();
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
    saver.abort();
    if let Err(e) = reg.state.save() {
        tracing::warn!(error = %e, "cannot write state file on shutdown");
    }
    let _ = std::fs::remove_file(&socket);
    let _ = std::fs::remove_file(&record);
    let _ = watcher.await;
    supervisor.abort();
    drop(claim_guard);
    tracing::info!("stopped");
    Ok(())
}
