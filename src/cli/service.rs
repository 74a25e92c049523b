//! `service`: the systemd or launchd user unit, or the Windows logon start, and its commands.
//!
//! `service install|uninstall|status` for systemd (Linux), launchd (macOS) and the Run key
//! (Windows): the unit this binary writes, the manager's steps (each required or tolerated,
//! with the fix a failure prints), and the commands themselves. The run-time side is
//! `broker::sd_notify`.
//!
//! Windows starts the daemon at logon through the user's Run key, not a scheduled task: an
//! "at logon" task needs an elevated prompt to create, the Run key only the user's own rights
//! (one `reg add`, listed and switchable in Task Manager's Startup apps). The value runs a
//! `logon.cmd` this binary writes, under `conhost.exe --headless` so no console window opens.

use anyhow::Context as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The systemd unit shipped in `systemd/`.
pub const SYSTEMD_UNIT: &str = include_str!("../../systemd/pi-ide-broker.service");
/// The launchd agent shipped in `launchd/`.
pub const LAUNCHD_PLIST: &str = include_str!("../../launchd/dev.pi-ide-broker.plist");
/// The launchd label.
pub const LAUNCHD_LABEL: &str = "dev.pi-ide-broker";
/// The systemd unit name.
pub const SYSTEMD_NAME: &str = "pi-ide-broker.service";
/// The Windows Run key the logon start is a value of (named [`RUN_VALUE`]).
pub const RUN_KEY: &str = r"HKCU\Software\Microsoft\Windows\CurrentVersion\Run";
/// The value's name under [`RUN_KEY`].
pub const RUN_VALUE: &str = "pi-ide-broker";

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
    /// Windows: a value of the user's Run key, started at logon.
    RunKey,
}

impl Manager {
    /// launchd on macOS, the Run key on Windows, systemd elsewhere.
    pub fn here() -> Manager {
        if cfg!(target_os = "macos") {
            Manager::Launchd
        } else if cfg!(windows) {
            Manager::RunKey
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
        Manager::RunKey => logon_script(bin, config, home),
    }
}

/// Windows: the script the Run value starts, in `%LOCALAPPDATA%\pi-ide-broker`, its output
/// appended to `daemon.log` beside it.
fn logon_script(bin: &Path, config: Option<&Path>, home: &Path) -> UnitFile {
    let dir = home.join("AppData").join("Local").join("pi-ide-broker");
    let config = config
        .map(|c| format!(" --config \"{}\"", c.display()))
        .unwrap_or_default();
    UnitFile {
        path: dir.join("logon.cmd"),
        content: format!(
            "@echo off\r\nrem pi-ide-broker at logon: started by the value {RUN_VALUE} of {RUN_KEY}\r\n\"{}\"{config} daemon >> \"{}\" 2>&1\r\n",
            bin.display(),
            dir.join("daemon.log").display()
        ),
    }
}

/// The Run value's data: the logon script under a console host that opens no window.
pub fn run_value_data(unit: &UnitFile) -> String {
    format!("conhost.exe --headless \"{}\"", unit.path.display())
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
    let uid = crate::platform::user::uid();
    let daemon = crate::cli::hint::hint("daemon");
    let systemd_fix = format!(
        "systemd has no user session here (a container, a system without systemd, or a login \
         without `loginctl enable-linger $USER`); run the daemon with `{daemon}` instead, or \
         let the pi extension start it"
    );
    let domain = format!("gui/{uid}");
    let target = format!("{domain}/{LAUNCHD_LABEL}");
    let plist = unit.path.display().to_string();
    let launchd_fix = format!(
        "launchd has no GUI session for this user here (over SSH, or before anyone logged in \
         at the Mac's screen). The agent is written to {plist} and loads at your next login; \
         to start it now, run `launchctl bootstrap {domain} {plist}` from Terminal on the Mac \
         itself, or run `{daemon}` in the meantime"
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
        (Manager::RunKey, true) => {
            let fix = format!(
                "the Run key could not be written; add the value by hand in regedit ({RUN_KEY}, \
                 a string named {RUN_VALUE} holding `{}`), or run `{daemon}`",
                run_value_data(unit)
            );
            vec![
                Step::required(
                    s(&["reg", "add", RUN_KEY, "/v", RUN_VALUE, "/t", "REG_SZ", "/d"])
                        .into_iter()
                        .chain([run_value_data(unit), "/f".into()])
                        .collect(),
                    fix.clone(),
                ),
                Step::required(s(&["reg", "query", RUN_KEY, "/v", RUN_VALUE]), fix),
            ]
        }
        (Manager::RunKey, false) => vec![Step::tolerated(&[
            "reg", "delete", RUN_KEY, "/v", RUN_VALUE, "/f",
        ])],
    }
}

/// What `service` was asked to do.
pub enum Action {
    /// Write the unit (with this config file, if given) and start it; `dry_run` only prints.
    Install {
        /// Print what would be written and run, change nothing.
        dry_run: bool,
        /// The config file the service runs with.
        config: Option<PathBuf>,
    },
    /// Stop the service and remove its unit; `dry_run` only prints.
    Uninstall {
        /// Print what would be removed and run, change nothing.
        dry_run: bool,
    },
    /// The service manager's own report.
    Status,
}

/// `service install|uninstall|status` for `manager`.
pub fn command(action: Action, manager: Manager) -> anyhow::Result<ExitCode> {
    let bin = std::env::current_exe().context("cannot find this binary's path")?;
    let bin = std::fs::canonicalize(&bin).unwrap_or(bin);
    // Windows' canonical form is verbatim (`\\?\C:\…`), which `cmd.exe` does not run.
    let bin = crate::protocol::winpath::plain_path(bin);
    let home = crate::sys::config::home_dir();
    let config_home = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| home.join(".config"));
    let unit_config = match &action {
        Action::Install {
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
    let unit = unit(manager, &bin, unit_config.as_deref(), &home, &config_home);
    match action {
        Action::Install { dry_run, .. } => service_install(manager, &unit, &home, dry_run),
        Action::Uninstall { dry_run } => service_uninstall(manager, &unit, dry_run),
        Action::Status => service_status(manager),
    }
}

/// The steps as `--dry-run` prints them.
fn shown(steps: &[Step]) -> String {
    steps.iter().map(Step::shown).collect::<Vec<_>>().join("\n")
}

/// `service install`: the unit written, then the manager's steps.
fn service_install(
    manager: Manager,
    unit: &UnitFile,
    home: &std::path::Path,
    dry_run: bool,
) -> anyhow::Result<ExitCode> {
    let steps = commands(manager, unit, true);
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
    if manager == Manager::Launchd {
        let logs = home.join("Library/Logs/pi-ide-broker");
        std::fs::create_dir_all(&logs)
            .with_context(|| format!("cannot create {}", logs.display()))?;
    }
    std::fs::write(&unit.path, &unit.content)
        .with_context(|| format!("cannot write {}", unit.path.display()))?;
    println!("wrote {}", unit.path.display());
    let code = run_reporting(&steps)?;
    if manager == Manager::RunKey && code == ExitCode::SUCCESS {
        println!(
            "it starts at every logon; to start it now, run `{}` (or let the pi extension start it)",
            crate::cli::hint::hint("daemon")
        );
    }
    Ok(code)
}

/// `service uninstall`: the manager's steps, then the unit removed.
fn service_uninstall(manager: Manager, unit: &UnitFile, dry_run: bool) -> anyhow::Result<ExitCode> {
    let steps = commands(manager, unit, false);
    if dry_run {
        println!(
            "would run:\n{}\nwould remove {}",
            shown(&steps),
            unit.path.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let code = run_reporting(&steps)?;
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

/// Why no service manager can take a unit here (its probe failed, and how), or `None` when
/// one answers; `path` is the `PATH` to find the manager's tool on.
pub fn no_manager(manager: Manager, path: Option<&std::ffi::OsStr>) -> Option<String> {
    let probe: &[&str] = match manager {
        Manager::Systemd => &["systemctl", "--user", "show-environment"],
        Manager::Launchd => &["launchctl", "managername"],
        Manager::RunKey => &["reg", "query", RUN_KEY],
    };
    let mut cmd = std::process::Command::new(probe[0]);
    cmd.args(&probe[1..]).stdin(std::process::Stdio::null());
    if let Some(p) = path {
        cmd.env("PATH", p);
    }
    let out = match cmd.output() {
        Ok(out) if out.status.success() => return None,
        Ok(out) => out,
        Err(e) => return Some(format!("cannot run `{}`: {e}", probe[0])),
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let tail: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = tail[tail.len().saturating_sub(4)..].join(" / ");
    Some(format!(
        "`{}` failed ({}): {tail}",
        probe.join(" "),
        out.status
    ))
}

/// What `service status` says when the manager reports no running service: install it where
/// a service manager answers; where none does (a container), that there is none to install and
/// what starts a daemon instead.
fn not_running_hint(asked: &str, status: &str) -> String {
    let hint = crate::cli::hint::hint;
    match no_manager(Manager::here(), std::env::var_os("PATH").as_deref()) {
        None => format!(
            "`{asked}` says the service is not running ({status}); `{}` installs and starts it",
            hint("service install")
        ),
        Some(why) => format!(
            "no user service manager answers here ({why}), so there is no service to install; \
             the pi extension and the `mcp` door start a daemon when none runs, or run `{}` \
             (`{}` says whether one runs)",
            hint("daemon"),
            hint("status")
        ),
    }
}

/// `service status`: the service manager's own report, straight to the terminal.
fn service_status(manager: Manager) -> anyhow::Result<ExitCode> {
    let argv: Vec<String> = match manager {
        Manager::Systemd => ["systemctl", "--user", "status", "--no-pager", SYSTEMD_NAME]
            .map(String::from)
            .to_vec(),
        Manager::Launchd => vec![
            "launchctl".into(),
            "print".into(),
            format!("gui/{}/{}", crate::platform::user::uid(), LAUNCHD_LABEL),
        ],
        Manager::RunKey => ["reg", "query", RUN_KEY, "/v", RUN_VALUE]
            .map(String::from)
            .to_vec(),
    };
    match std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .status()
    {
        Ok(s) if s.success() => Ok(ExitCode::SUCCESS),
        Ok(s) => {
            eprintln!("{}", not_running_hint(&argv.join(" "), &s.to_string()));
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
fn run_reporting(steps: &[Step]) -> anyhow::Result<ExitCode> {
    match run_steps(steps) {
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

    /// Windows: the logon script runs this binary's daemon with its config, its output to a
    /// log beside it; the Run value starts it with no window; uninstall deletes that value.
    #[test]
    fn the_windows_logon_start_is_a_run_value_and_a_script() {
        let bin = Path::new(r"C:\Users\me\bin\pi-ide-broker.exe");
        let u = unit(
            Manager::RunKey,
            bin,
            Some(Path::new(r"C:\Users\me\my config.toml")),
            Path::new(r"C:\Users\me"),
            Path::new("unused"),
        );
        assert!(u.path.ends_with("logon.cmd"), "{}", u.path.display());
        assert!(
            u.content.contains(r#""C:\Users\me\bin\pi-ide-broker.exe" --config "C:\Users\me\my config.toml" daemon >> "#),
            "{}",
            u.content
        );
        assert!(u.content.contains("daemon.log\" 2>&1\r\n"), "{}", u.content);
        let install = commands(Manager::RunKey, &u, true);
        assert_eq!(
            install[0].argv[..5],
            ["reg", "add", RUN_KEY, "/v", RUN_VALUE]
        );
        let data = install[0].argv.iter().position(|a| a == "/d").unwrap() + 1;
        assert_eq!(
            install[0].argv[data],
            format!("conhost.exe --headless \"{}\"", u.path.display())
        );
        assert!(install.iter().all(|s| s.required.is_some()));
        let uninstall = commands(Manager::RunKey, &u, false);
        assert_eq!(uninstall[0].argv[..3], ["reg", "delete", RUN_KEY]);
        assert!(
            uninstall[0].required.is_none(),
            "a value not there is no failure"
        );
    }
}
