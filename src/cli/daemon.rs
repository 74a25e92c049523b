//! `daemon`: the broker in the foreground, as a service manager runs it.
//!
//! The `daemon` command: the broker in the foreground as a service manager runs it: stop and
//! reload requests (`platform::control`: TERM/INT stop and HUP reloads on Unix), sd-notify,
//! the log trimmed while it runs.

use crate::broker::sd_notify;
use crate::platform::control::{Request, Requests};
use crate::sys::config::Config;
use crate::sys::logging;
use std::path::PathBuf;
use std::process::ExitCode;
use tokio_util::sync::CancellationToken;

/// The exit status of a daemon that found another one holding the claim (running, or still
/// stopping): a start that lost a race, not a broken setup (the pi extension tells the user
/// of starts that fail otherwise).
pub(super) const EXIT_ALREADY_RUNNING: u8 = 4;

/// Where the service manager writes the log to a file (launchd), nothing else rotates it: cut
/// it back every 10 min, until the stop (on the registry's tracker, as every task of the daemon).
async fn trim_log_until(stop: CancellationToken) {
    let mut every = tokio::time::interval(std::time::Duration::from_secs(600));
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = every.tick() => {
                if let Err(e) = crate::platform::logfile::trim_stderr_log() {
                    tracing::debug!(error = %e, "cannot check the log file's size");
                }
            }
        }
    }
}

/// Runs the daemon until a stop request ends it (or it fails to start).
pub(super) async fn run(config: Config, config_path: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let logs = logging::init(&config);
    // The pi extension setup wrote, brought to this binary's version (a no-op when it is).
    crate::cli::setup::extension::refresh(&config.data_dir());
    let shutdown = CancellationToken::new();
    let mut requests = Requests::listen()?;
    let (handle_tx, mut handle_rx) = tokio::sync::oneshot::channel();
    let stop = shutdown.clone();
    let serving = tokio::spawn(crate::broker::serve(config, stop, move |_ready, handle| {
        let _ = handle_tx.send(handle);
    }));
    let mut handle: Option<crate::broker::Handle> = None;
    // A oneshot must not be polled again once it has completed (with a handle or, when the
    // daemon failed to start, with nothing).
    let mut handle_pending = true;
    tokio::pin!(serving);
    loop {
        tokio::select! {
            r = &mut serving => {
                return match r {
                    Ok(Ok(())) if crate::broker::own_binary::stopped_for_it() => {
                        Ok(ExitCode::from(crate::broker::own_binary::EXIT_REPLACED))
                    }
                    Ok(Ok(())) => Ok(ExitCode::SUCCESS),
                    Ok(Err(crate::broker::Error::Socket(e @ crate::platform::Error::AlreadyRunning { .. }))) => {
                        eprintln!("error: {e}");
                        Ok(ExitCode::from(EXIT_ALREADY_RUNNING))
                    }
                    Ok(Err(e)) => Err(e.into()),
                    Err(e) => Err(anyhow::anyhow!("the daemon task failed: {e}")),
                };
            }
            h = &mut handle_rx, if handle_pending => {
                handle_pending = false;
                handle = h.ok();
                if let Some(h) = &handle {
                    // On the daemon's tracker, so the stop order waits for it like every task.
                    let reg = h.registry();
                    reg.tracker.spawn(trim_log_until(reg.cancel.clone()));
                    // Upgraded under us: hand over to the new binary; uninstalled: stop (once
                    // nothing is pending either way).
                    if let Some(own) = crate::broker::own_binary::OwnBinary::current() {
                        reg.tracker.spawn(crate::broker::own_binary::watch(h.clone(), own, shutdown.clone()));
                    }
                    sd_notify::announce_ready(reg);
                }
            }
            request = requests.next() => {
                if request == Request::Stop {
                    sd_notify::announce_stopping();
                    shutdown.cancel();
                    continue;
                }
                let Some(h) = &handle else { continue };
                sd_notify::notify_reloading();
                match &config_path {
                    None => tracing::warn!("reload asked: no config file to reload"),
                    Some(path) => match Config::load(path, &crate::frontdoor::sections()) {
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
                sd_notify::announce_reloaded(h.registry());
            }
        }
    }
}
