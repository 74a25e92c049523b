//! Where no service manager can run the broker, setup starts one in the background (as the pi
//! extension and `pi-ide-broker mcp` would), and `--undo` stops that one, and no other.

use super::Env;
use std::time::{Duration, Instant};

/// Whether a daemon answers on the socket.
pub(super) fn answering(env: &Env) -> bool {
    crate::platform::local::connect_blocking(&env.socket).is_ok()
}

/// The daemon's log when setup starts it.
pub(super) fn log_path(env: &Env) -> std::path::PathBuf {
    env.state_dir.join("daemon.log")
}

/// Starts `pi-ide-broker daemon` detached (its own process group, output to its log) and
/// waits until it answers; its pid.
pub(super) fn start(env: &Env) -> Result<u32, String> {
    std::fs::create_dir_all(&env.state_dir)
        .map_err(|e| format!("cannot create {}: {e}", env.state_dir.display()))?;
    let log_path = log_path(env);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| format!("cannot open {}: {e}", log_path.display()))?;
    let err = log.try_clone().map_err(|e| e.to_string())?;
    let mut cmd = std::process::Command::new(&env.exe);
    if let Some(c) = &env.config {
        cmd.arg("--config").arg(c);
    }
    cmd.arg("daemon")
        .env("PI_IDE_BROKER_SOCKET", &env.socket)
        .stdin(std::process::Stdio::null())
        .stdout(log)
        .stderr(err);
    crate::platform::control::detach(&mut cmd);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start the daemon: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if answering(env) {
            return Ok(child.id());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "the daemon exited ({status}); its log: {}",
                log_path.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!(
        "the daemon did not answer on {} within 10 s; its log: {}",
        env.socket.display(),
        log_path.display()
    ))
}

/// Whether `pid` is a running `pi-ide-broker daemon` (by its command line where `/proc`
/// says; elsewhere, by being alive).
fn is_our_daemon(pid: u32) -> bool {
    match std::fs::read(format!("/proc/{pid}/cmdline")) {
        Ok(cmdline) => {
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            args.first().is_some_and(|a| a.ends_with(b"pi-ide-broker"))
                && args.iter().any(|a| *a == b"daemon")
        }
        Err(_) => crate::platform::process::alive(pid),
    }
}

/// Stops the daemon setup started, if it still runs; whether it did.
pub(super) fn stop(pid: u32) -> Result<bool, String> {
    if !is_our_daemon(pid) {
        return Ok(false);
    }
    crate::platform::control::request_stop(pid)
        .map_err(|e| format!("cannot stop pid {pid}: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if !is_our_daemon(pid) {
            return Ok(true);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("pid {pid} did not stop within 10 s of SIGTERM"))
}
