//! Running as a user service: sd-notify (READY, STATUS, WATCHDOG, RELOADING, STOPPING), and
//! `service install|uninstall|status` for systemd (Linux) and launchd (macOS).

use crate::registry::Registry;
use sd_notify::NotifyState;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The systemd unit shipped in `systemd/`.
pub const SYSTEMD_UNIT: &str = include_str!("../systemd/pi-ide-broker.service");
/// The launchd agent shipped in `launchd/`.
pub const LAUNCHD_PLIST: &str = include_str!("../launchd/dev.pi-ide-broker.plist");
/// The launchd label.
pub const LAUNCHD_LABEL: &str = "dev.pi-ide-broker";
/// The systemd unit name.
pub const SYSTEMD_NAME: &str = "pi-ide-broker.service";

/// Sends states to the service manager; a no-op without `NOTIFY_SOCKET`.
pub fn notify(states: &[NotifyState]) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    if let Err(e) = sd_notify::notify(states) {
        tracing::debug!(error = %e, "sd_notify failed");
    }
}

/// Tells the service manager the daemon is ready, and keeps it told (see [`run`]). Only the
/// `daemon` command does, never a broker a library user runs (such as a test's, which may
/// inherit a manager's `NOTIFY_SOCKET`).
pub fn announce_ready(reg: &Arc<Registry>) {
    let line = status_line(reg);
    notify(&[NotifyState::Ready, NotifyState::Status(&line)]);
    reg.tracker.spawn(run(reg.clone()));
}

/// Tells the service manager the daemon is stopping.
pub fn announce_stopping() {
    notify(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
}

/// "4 editors ready, 9 sessions"
pub fn status_line(reg: &Registry) -> String {
    let editors = reg.editors();
    let ready = editors
        .iter()
        .filter(|e| e.state() == crate::editor::LinkState::Ready)
        .count();
    let total = editors.len();
    let sessions = reg.sessions().len();
    let mut s = format!("{ready} editor{} ready", if ready == 1 { "" } else { "s" });
    if total > ready {
        s.push_str(&format!(" ({} not ready)", total - ready));
    }
    s.push_str(&format!(
        ", {sessions} session{}",
        if sessions == 1 { "" } else { "s" }
    ));
    s
}

/// Keeps `STATUS=` current (at most one update every 500 ms) and pings the watchdog from the
/// runtime when `WATCHDOG_USEC` asks for it: a stuck runtime stops the pings.
pub async fn run(reg: Arc<Registry>) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    let watchdog = watchdog_interval();
    let mut changes = reg.subscribe_changes();
    let mut last = String::new();
    let mut tick = tokio::time::interval(watchdog.unwrap_or(Duration::from_secs(3600)));
    loop {
        tokio::select! {
            _ = reg.cancel.cancelled() => return,
            _ = tick.tick() => {
                if watchdog.is_some() {
                    notify(&[NotifyState::Watchdog]);
                }
            }
            r = changes.changed() => {
                if r.is_err() { return }
                tokio::time::sleep(Duration::from_millis(500)).await;
                changes.borrow_and_update();
                let line = status_line(&reg);
                if line != last {
                    notify(&[NotifyState::Status(&line)]);
                    last = line;
                }
            }
        }
    }
}

/// Half of `WATCHDOG_USEC`, when the watchdog is on for us: as in libsystemd, a
/// `WATCHDOG_PID` that names another process turns it off, a missing one does not.
fn watchdog_interval() -> Option<Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    if let Ok(pid) = std::env::var("WATCHDOG_PID") {
        if pid.parse::<u32>().ok() != Some(std::process::id()) {
            return None;
        }
    }
    (usec > 0).then(|| Duration::from_micros(usec / 2).max(Duration::from_millis(10)))
}

/// `RELOADING=1` with `MONOTONIC_USEC` in the same datagram, as systemd wants.
pub fn notify_reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => notify(&[NotifyState::Reloading, now]),
        Err(_) => notify(&[NotifyState::Reloading]),
    }
}

/// Where a unit goes and what it says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitFile {
    /// The file to write.
    pub path: PathBuf,
    /// Its content, with the real binary path.
    pub content: String,
}

/// Which service manager this machine uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Manager {
    /// systemd user units.
    Systemd,
    /// launchd LaunchAgents.
    Launchd,
}

impl Manager {
    /// launchd on macOS, systemd elsewhere.
    pub fn here() -> Manager {
        if cfg!(target_os = "macos") {
            Manager::Launchd
        } else {
            Manager::Systemd
        }
    }
}

/// The unit for `manager`, pointing at `bin` (with `--config config` when given), under `home`.
pub fn unit(
    manager: Manager,
    bin: &Path,
    config: Option<&Path>,
    home: &Path,
    config_home: &Path,
) -> UnitFile {
    match manager {
        Manager::Systemd => {
            let exec = match config {
                // systemd splits ExecStart on spaces unless quoted.
                Some(c) => format!(
                    "{} --config \"{}\" daemon",
                    bin.display(),
                    c.display().to_string().replace('"', "\\\"")
                ),
                None => format!("{} daemon", bin.display()),
            };
            UnitFile {
                path: config_home.join("systemd").join("user").join(SYSTEMD_NAME),
                content: SYSTEMD_UNIT.replace("%h/.cargo/bin/pi-ide-broker daemon", &exec),
            }
        }
        Manager::Launchd => UnitFile {
            path: home
                .join("Library")
                .join("LaunchAgents")
                .join(format!("{LAUNCHD_LABEL}.plist")),
            content: LAUNCHD_PLIST
                .replace(
                    "<string>__BIN__</string>",
                    &match config {
                        Some(c) => format!(
                            "<string>{}</string>\n\t\t<string>--config</string>\n\t\t<string>{}</string>",
                            xml_escape(&bin.display().to_string()),
                            xml_escape(&c.display().to_string())
                        ),
                        None => format!("<string>{}</string>", xml_escape(&bin.display().to_string())),
                    },
                )
                .replace("__HOME__", &xml_escape(&home.display().to_string())),
        },
    }
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// One service-manager command of an install or uninstall, and what its failure means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// The command line (program first).
    pub argv: Vec<String>,
    /// `None`: its failure is expected and harmless (stopping a unit that is not loaded).
    /// `Some(fix)`: the step must succeed, and `fix` tells the user what to do when it fails.
    pub required: Option<String>,
}

impl Step {
    fn tolerated(argv: &[&str]) -> Step {
        Step {
            argv: argv.iter().map(|x| x.to_string()).collect(),
            required: None,
        }
    }

    fn required(argv: Vec<String>, fix: String) -> Step {
        Step {
            argv,
            required: Some(fix),
        }
    }

    /// The command as a user would type it.
    pub fn shown(&self) -> String {
        self.argv.join(" ")
    }
}

/// Why a required step did not go through.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// The program is not on this machine (no systemd user session, not a Mac).
    #[error("{program} is not available here")]
    Missing {
        /// The program that was not found.
        program: String,
    },
    /// The program ran and failed.
    #[error("`{command}` failed ({status}){output}")]
    Failed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// What it printed to stderr, on a line of its own (empty if nothing).
        output: String,
    },
}

/// Runs `steps` in order, stopping at the first required step that fails; returns its index,
/// the error and the fix. A tolerated step's failure is ignored.
pub fn run_steps(steps: &[Step]) -> Result<(), (usize, StepError, String)> {
    for (i, step) in steps.iter().enumerate() {
        let Some((program, args)) = step.argv.split_first() else {
            continue;
        };
        let fix = step.required.clone().unwrap_or_default();
        match std::process::Command::new(program)
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
        {
            Ok(out) if out.status.success() || step.required.is_none() => {}
            Ok(out) => {
                let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
                let output = if err.is_empty() {
                    String::new()
                } else {
                    format!(":\n  {err}")
                };
                let e = StepError::Failed {
                    command: step.shown(),
                    status: out.status,
                    output,
                };
                return Err((i, e, fix));
            }
            Err(_) if step.required.is_none() => {}
            Err(_) => {
                let program = program.clone();
                return Err((i, StepError::Missing { program }, fix));
            }
        }
    }
    Ok(())
}

/// The steps that activate (`install`) or deactivate (`uninstall`) the unit. An install
/// checks what it did: systemd's `enable --now` fails by itself when the unit cannot start,
/// and launchd's `bootstrap` is followed by `launchctl print`, which fails unless the agent
/// is really loaded.
pub fn commands(manager: Manager, unit: &UnitFile, install: bool) -> Vec<Step> {
    let uid = rustix::process::getuid().as_raw();
    let systemd_fix = "systemd has no user session here (a container, a system without \
                       systemd, or a login without `loginctl enable-linger $USER`); run the \
                       daemon with `pi-ide-broker daemon` instead, or let the pi extension \
                       start it"
        .to_string();
    let domain = format!("gui/{uid}");
    let target = format!("{domain}/{LAUNCHD_LABEL}");
    let plist = unit.path.display().to_string();
    let launchd_fix = format!(
        "launchd has no GUI session for this user here (over SSH, or before anyone logged in \
         at the Mac's screen). The agent is written to {plist} and loads at your next login; \
         to start it now, run `launchctl bootstrap {domain} {plist}` from Terminal on the Mac \
         itself, or run `pi-ide-broker daemon` in the meantime"
    );
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    match (manager, install) {
        (Manager::Systemd, true) => vec![
            Step::required(
                s(&["systemctl", "--user", "daemon-reload"]),
                systemd_fix.clone(),
            ),
            Step::required(
                s(&["systemctl", "--user", "enable", "--now", SYSTEMD_NAME]),
                format!(
                    "{systemd_fix}. If systemd runs, `journalctl --user -u {SYSTEMD_NAME}` \
                     says why the service did not start"
                ),
            ),
        ],
        (Manager::Systemd, false) => vec![
            Step::tolerated(&["systemctl", "--user", "disable", "--now", SYSTEMD_NAME]),
            Step::tolerated(&["systemctl", "--user", "daemon-reload"]),
        ],
        (Manager::Launchd, true) => vec![
            // Not loaded yet on a first install: its failure is expected.
            Step::tolerated(&["launchctl", "bootout", &target]),
            Step::required(
                s(&["launchctl", "bootstrap", &domain, &plist]),
                launchd_fix.clone(),
            ),
            Step::required(s(&["launchctl", "print", &target]), launchd_fix),
        ],
        (Manager::Launchd, false) => vec![Step::tolerated(&["launchctl", "bootout", &target])],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_point_at_the_real_binary() {
        let u = unit(
            Manager::Systemd,
            Path::new("/opt/b/pi-ide-broker"),
            None,
            Path::new("/home/u"),
            Path::new("/home/u/.config"),
        );
        assert_eq!(
            u.path,
            PathBuf::from("/home/u/.config/systemd/user/pi-ide-broker.service")
        );
        assert!(u.content.contains("ExecStart=/opt/b/pi-ide-broker daemon"));
        assert!(u.content.contains("Type=notify"));
        let l = unit(
            Manager::Launchd,
            Path::new("/opt/b/pi-ide-broker"),
            None,
            Path::new("/Users/u"),
            Path::new("/x"),
        );
        assert_eq!(
            l.path,
            PathBuf::from("/Users/u/Library/LaunchAgents/dev.pi-ide-broker.plist")
        );
        assert!(l.content.contains("<string>/opt/b/pi-ide-broker</string>"));
        assert!(l
            .content
            .contains("/Users/u/Library/Logs/pi-ide-broker/pi-ide-broker.log"));
        assert!(!l.content.contains("__"));
    }
}
