//! `stop` and `reload`: the running daemon asked to stop, or to read its config again.
//!
//! Either works however the daemon was started.

use crate::cli::service;
use crate::frontdoor::client;
use crate::sys::config::Config;
use anyhow::Context as _;
use std::path::PathBuf;
use std::process::ExitCode;

/// `stop`: asks the daemon that answers on the socket for its pid, asks it to stop (SIGTERM,
/// or its stop event on Windows: the graceful stop, pending diffs answered, sessions told), and
/// waits until nothing answers and the process is gone: its socket closes before its
/// `daemon.lock` is released, and a daemon started right after `stop` must find the claim free.
pub(super) async fn command(config: &Config) -> anyhow::Result<ExitCode> {
    let Some((socket, pid)) = our_daemon(config, "stop").await? else {
        return Ok(ExitCode::SUCCESS);
    };
    crate::platform::control::request_stop(pid)
        .with_context(|| format!("cannot ask the daemon (pid {pid}) to stop"))?;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while tokio::time::Instant::now() < deadline {
        if matches!(
            client::get_json(&socket, "/v1/status").await,
            Err(client::ClientError::NotRunning(_))
        ) && !crate::platform::process::alive(pid)
        {
            println!("stopped the daemon (pid {pid})");
            let home = crate::sys::config::home_dir();
            let env = crate::cli::setup::Env::from_process(config, None);
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
        "the daemon (pid {pid}) is still running 20 s after it was asked to stop; see its log (`pi-ide-broker paths`), or end it by force ({})",
        crate::platform::control::force_hint(pid)
    )
}

/// What `stop` and `reload` read of the status document: only the daemon's pid, so that a
/// daemon of another version is stopped as well.
#[derive(serde::Deserialize)]
struct Answering {
    broker: AnsweringBroker,
}

/// The daemon's own line, as far as `stop` reads it.
#[derive(serde::Deserialize)]
struct AnsweringBroker {
    pid: u32,
}

/// The socket and pid of the daemon answering on this config's socket, checked against this
/// machine's running record (a socket forwarded from elsewhere names another machine's pid);
/// `None` (said so) when nothing runs. `what` is the action, for the messages.
async fn our_daemon(config: &Config, what: &str) -> anyhow::Result<Option<(PathBuf, u32)>> {
    let socket = config.socket_to_dial();
    let status: Answering = match client::get(&socket, "/v1/status").await {
        Ok(s) => s,
        Err(client::ClientError::NotRunning(s)) => {
            println!("no daemon is running (nothing answers on {s}); nothing to {what}");
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    let pid = status.broker.pid;
    if pid == 0 {
        anyhow::bail!("the daemon's status names pid 0; is it another version? restart it by hand");
    }
    let record = config.running_record();
    if crate::platform::local::recorded(&record).map(|(p, _)| p) != Some(pid) {
        anyhow::bail!(
            "the daemon answering on {} (pid {}) is not the one {} records: it runs elsewhere (a forwarded socket?); {what} it where it runs",
            socket.display(),
            pid,
            record.display()
        );
    }
    Ok(Some((socket, pid)))
}

/// `reload`: asks the running daemon to read its config file again (SIGHUP; its reload
/// event on Windows), as `systemctl --user reload` does. Its log says what changed.
pub(super) async fn reload(config: &Config) -> anyhow::Result<ExitCode> {
    let Some((_, pid)) = our_daemon(config, "reload").await? else {
        return Ok(ExitCode::FAILURE);
    };
    crate::platform::control::request_reload(pid)
        .with_context(|| format!("cannot ask the daemon (pid {pid}) to reload"))?;
    println!("asked the daemon (pid {pid}) to reload its config; its log says what changed (`pi-ide-broker paths`)");
    Ok(ExitCode::SUCCESS)
}
