//! `doctor`: every check between an agent and its editor, and what to fix.
//!
//! `pi-ide-broker doctor`: checks everything between an agent and its editor and says, line
//! by line, what works and what to do about what does not. It reads the same config, files and
//! sockets the daemon does, and asks the daemon what it decided (`/v1/status`, `/v1/route`).

mod lockfiles;

use crate::cli::hint::hint;
use crate::frontdoor::status::Status;
use crate::protocol::percent::encode_query;
use crate::registry::explain::{RouteDecision, RouteExplanation};
use crate::sys::config::Config;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

pub(super) use crate::frontdoor::plugin::{Check, Level};

/// The whole report.
#[derive(Clone, Debug, Serialize)]
pub(super) struct Report {
    /// Every check, in the order a person reads them.
    pub checks: Vec<Check>,
    /// The daemon's route explanation for the cwd (`GET /v1/route`), when it runs.
    pub route: Option<RouteExplanation>,
    /// True when everything a user needs works (exit status 0).
    pub ok: bool,
}

/// What to check.
pub(super) struct Options {
    /// The config file (it may be missing: defaults).
    pub config_path: Option<PathBuf>,
    /// The working directory whose route is explained.
    pub cwd: PathBuf,
    /// A sticky key to explain the route for.
    pub key: Option<String>,
}

struct Builder(Vec<Check>);

impl Builder {
    fn add(&mut self, what: impl Into<String>, level: Level, message: impl Into<String>) {
        self.0.push(Check {
            what: what.into(),
            level,
            message: message.into(),
            fix: None,
        });
    }

    fn fix(
        &mut self,
        what: impl Into<String>,
        level: Level,
        message: impl Into<String>,
        fix: impl Into<String>,
    ) {
        self.0.push(Check {
            what: what.into(),
            level,
            message: message.into(),
            fix: Some(fix.into()),
        });
    }
}

/// What the daemon says of rights: this connection's own (an agent's, when doctor runs in a
/// container that mounts the main socket) and the agents it saw on the main socket (a user
/// who mounts the main socket into a container, from before remotes had sockets of their own).
fn check_rights(b: &mut Builder, st: &Status) {
    if let Some(c) = st.connection.as_ref().filter(|c| c.realm.is_some()) {
        b.fix(
            "rights",
            Level::Warn,
            format!(
                "this connection has an agent's rights only: {}; its own sessions are all it sees",
                c.why
            ),
            c.hint.clone(),
        );
    }
    for a in &st.agents_on_main_socket {
        b.fix(
            "main socket",
            Level::Warn,
            format!(
                "{} connection{} on the main socket got an agent's rights only: {}",
                a.connections,
                if a.connections == 1 { "" } else { "s" },
                a.why
            ),
            a.hint.clone(),
        );
    }
    for r in st.broker.remote_sockets.iter().filter(|r| !r.listening) {
        b.fix(
            "remote sockets",
            Level::Warn,
            format!("[[remote]] {:?} has no socket at {}", r.name, r.path.display()),
            format!("restart the broker after adding a [[remote]] (`{}`; it starts again on the next use)", hint("stop")),
        );
    }
}

/// Runs every check.
pub(super) async fn run(opts: &Options) -> Report {
    let mut b = Builder(Vec::new());
    let config = check_config(&mut b, opts.config_path.as_deref());
    let socket = config.socket_to_dial();
    let status = crate::frontdoor::client::get::<Status>(&socket, "/v1/status")
        .await
        .ok();
    check_daemon(&mut b, status.as_ref(), &socket);
    check_service(&mut b);
    if status.is_some() {
        check_socket(&mut b, &socket, &config.allow_uids);
    }
    if !config.allow_uids.is_empty() {
        b.add(
            "allow_uids",
            Level::Ok,
            format!(
                "besides you, uids {:?} may use the socket, with an agent's rights only",
                config.allow_uids
            ),
        );
    }
    if let Some(st) = &status {
        check_rights(&mut b, st);
    }
    for dir in config.lock_dirs() {
        lockfiles::check_lock_dir(&mut b, &dir, status.as_ref()).await;
    }
    for door in crate::frontdoor::DOORS {
        b.0.extend(door.doctor(&config, status.as_ref().map(|s| &s.doors)));
    }
    check_single_client(&mut b, &config);
    let route = match &status {
        Some(_) => {
            let mut path = format!(
                "/v1/route?cwd={}",
                encode_query(&opts.cwd.display().to_string())
            );
            if let Some(k) = &opts.key {
                path.push_str(&format!("&session={}", encode_query(k)));
            }
            crate::frontdoor::client::get(&socket, &path).await.ok()
        }
        None => None,
    };
    if let Some(r) = &route {
        check_route(&mut b, r, &opts.cwd);
    }
    let ok = b.0.iter().all(|c| c.level != Level::Fail);
    Report {
        checks: b.0,
        route,
        ok,
    }
}

fn check_config(b: &mut Builder, path: Option<&Path>) -> Config {
    let Some(path) = path else {
        b.add("config", Level::Ok, "no config file location; defaults");
        return Config::default();
    };
    if !path.exists() {
        b.add(
            "config",
            Level::Ok,
            format!("{} does not exist; defaults", path.display()),
        );
        return Config::default();
    }
    match Config::load(path, &crate::frontdoor::sections()) {
        Ok(c) => {
            let keys = set_keys(path);
            let msg = if keys.is_empty() {
                format!("{} parsed; every key at its default", path.display())
            } else {
                format!("{} parsed; sets {}", path.display(), keys.join(", "))
            };
            b.add("config", Level::Ok, msg);
            c
        }
        Err(e) => {
            b.fix(
                "config",
                Level::Fail,
                e.to_string(),
                format!(
                    "fix {} (config.example.toml lists every key), or move it away to use defaults",
                    path.display()
                ),
            );
            Config::default()
        }
    }
}

/// The keys a config file sets (top-level keys and `table.key`), for "what differs from the
/// defaults".
fn set_keys(path: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    let Ok(table) = text.parse::<toml::Table>() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (k, v) in &table {
        match v {
            toml::Value::Table(t) => out.extend(t.keys().map(|sub| format!("{k}.{sub}"))),
            _ => out.push(k.clone()),
        }
    }
    out
}

fn check_daemon(b: &mut Builder, status: Option<&Status>, socket: &Path) {
    match status {
        Some(s) => b.add(
            "daemon",
            Level::Ok,
            format!(
                "running: pid {}, version {}, up {} s, socket {}",
                s.broker.pid,
                s.broker.version,
                s.broker.uptime_s,
                s.broker.socket.display()
            ),
        ),
        None => {
            // The service only where a service manager would take it (a container has none).
            let here = crate::cli::service::Manager::here();
            let path = std::env::var_os("PATH");
            let for_good = match crate::cli::service::no_manager(here, path.as_deref()) {
                None => format!(", or for good: `{}`", hint("service install")),
                Some(_) => ", or let the pi extension or an `mcp` door start one".to_string(),
            };
            b.fix(
                "daemon",
                Level::Fail,
                format!("not running (nothing answers on {})", socket.display()),
                format!("start it: `{}`{for_good}", hint("daemon")),
            )
        }
    }
}

fn check_service(b: &mut Builder) {
    let ask = |args: &[&str], cmd: &str| {
        std::process::Command::new(cmd)
            .args(args)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    if cfg!(windows) {
        use crate::cli::service::{RUN_KEY, RUN_VALUE};
        match ask(&["query", RUN_KEY, "/v", RUN_VALUE], "reg") {
            Some(out) if out.contains(RUN_VALUE) => b.add(
                "service",
                Level::Ok,
                format!("starts at logon ({RUN_KEY}\\{RUN_VALUE})"),
            ),
            _ => b.fix(
                "service",
                Level::Warn,
                "nothing starts the daemon at logon",
                format!("`{}` adds it to your Run key", hint("service install")),
            ),
        }
        return;
    }
    if cfg!(target_os = "macos") {
        match ask(&["list", crate::cli::service::LAUNCHD_LABEL], "launchctl") {
            Some(out) if !out.is_empty() => b.add("service", Level::Ok, "launchd agent loaded"),
            _ => b.fix(
                "service",
                Level::Warn,
                "no launchd agent loaded",
                format!("`{}` starts it at every login", hint("service install")),
            ),
        }
        return;
    }
    let unit = crate::cli::service::SYSTEMD_NAME;
    match (
        ask(&["--user", "is-enabled", unit], "systemctl"),
        ask(&["--user", "is-active", unit], "systemctl"),
    ) {
        (Some(en), Some(act)) if !en.is_empty() => systemd_unit_state(b, unit, &en, &act),
        _ if crate::cli::service::no_manager(crate::cli::service::Manager::Systemd, None).is_some() => b.fix(
            "service",
            Level::Warn,
            "no user service manager here (`systemctl --user` does not answer)",
            format!("nothing to install: `{}`, the pi extension and the `mcp` door start a daemon when none runs", hint("setup")),
        ),
        _ => b.fix(
            "service",
            Level::Warn,
            "no systemd user unit installed",
            format!("`{}` starts the daemon at every login", hint("service install")),
        ),
    }
}

/// The service line for a unit systemd knows: ok when enabled and active, else what to do.
fn systemd_unit_state(b: &mut Builder, unit: &str, enabled: &str, active: &str) {
    if enabled == "enabled" && active == "active" {
        b.add(
            "service",
            Level::Ok,
            format!("systemd user unit {unit}: enabled, active"),
        );
        return;
    }
    let (active, fix) = if active.is_empty() {
        (
            "state unknown (no user service manager answers)",
            "this session has no `systemctl --user`; the pi extension and the `mcp` door start a daemon themselves".to_string(),
        )
    } else if enabled != "enabled" {
        (
            active,
            format!("`{}` enables and starts it", hint("service install")),
        )
    } else {
        (
            active,
            format!("`systemctl --user start {unit}`; `journalctl --user -u {unit}` says why it stopped"),
        )
    };
    b.fix(
        "service",
        Level::Warn,
        format!("systemd user unit {unit}: {enabled}, {active}"),
        fix,
    );
}

fn mode_of(path: &Path) -> Option<(u32, u32)> {
    let (uid, mode) = crate::platform::user::owner_and_mode(&std::fs::metadata(path).ok()?)?;
    Some((mode & 0o777, uid))
}

fn check_socket(b: &mut Builder, socket: &Path, allow: &[u32]) {
    if cfg!(windows) {
        // A named pipe: no mode bits; its DACL (set at each instance) lets in our SID alone.
        if crate::platform::local::exists(socket) {
            b.add(
                "socket",
                Level::Ok,
                format!(
                    "{} (named pipe; only your account may open it)",
                    socket.display()
                ),
            );
        } else {
            b.add(
                "socket",
                Level::Warn,
                format!("{} not found", socket.display()),
            );
        }
        return;
    }
    let me = crate::platform::user::uid();
    match mode_of(socket) {
        Some((mode, uid)) if uid == me && mode & 0o077 == 0 => b.add(
            "socket",
            Level::Ok,
            format!("{} mode {mode:04o}, ours", socket.display()),
        ),
        // Opened up on purpose for other uids (a container's root): say who may use it.
        Some((mode, uid)) if uid == me && !allow.is_empty() => b.add(
            "socket",
            Level::Warn,
            format!(
                "{} mode {mode:04o}; other uids allowed: {allow:?} (allow_uids)",
                socket.display()
            ),
        ),
        Some((mode, uid)) => b.fix(
            "socket",
            Level::Fail,
            format!(
                "{} mode {mode:04o}, owner uid {uid} (we are {me})",
                socket.display()
            ),
            "stop the daemon, remove the socket and its dir, start it again (it creates them 0600 / 0700)",
        ),
        None => b.add("socket", Level::Warn, format!("{} not found", socket.display())),
    }
}

/// How a single-client editor's other client is seen (the `yield` policy needs it).
fn check_single_client(b: &mut Builder, config: &Config) {
    let yields = config.editors.single_client == crate::sys::config::SingleClient::Yield
        || config
            .editors
            .single_client_for
            .values()
            .any(|p| *p == crate::sys::config::SingleClient::Yield);
    if !yields {
        return;
    }
    match crate::platform::ports::SOURCE {
        Some(source) => b.add(
            "single-client editors",
            Level::Ok,
            format!("another client of an editor (your own Claude Code) is seen through {source}"),
        ),
        None => b.add(
            "single-client editors",
            Level::Warn,
            "this OS gives no way to see an editor's other clients: a single-client editor is redialled like any lost link",
        ),
    }
}

fn check_route(b: &mut Builder, route: &RouteExplanation, cwd: &Path) {
    let what = format!("route for {}", cwd.display());
    let settle = route.settle.clone().unwrap_or_default();
    match &route.decision {
        RouteDecision::Editor(id) => b.add(what, Level::Ok, format!("goes to editor {id}")),
        RouteDecision::Ambiguous(ids) => b.fix(
            what,
            Level::Fail,
            format!("ambiguous between {}", ids.join(", ")),
            settle,
        ),
        // No editor holds the folder (yet): a next step, not a fault — right after setup no
        // editor is open, and nothing is broken.
        RouteDecision::None(why) => b.fix(what, Level::Warn, why.clone(), settle),
    }
}

/// The report for a person: one line per check, ✓ / ! / ✗, the fix indented under it, then the
/// route's candidates.
pub(super) fn render(r: &Report) -> String {
    let mut out = String::new();
    for c in &r.checks {
        let mark = match c.level {
            Level::Ok => "✓",
            Level::Warn => "!",
            Level::Fail => "✗",
        };
        let _ = writeln!(out, "{mark} {}: {}", c.what, c.message);
        if let Some(fix) = &c.fix {
            let _ = writeln!(out, "    → {fix}");
        }
    }
    if let Some(route) = r.route.as_ref().filter(|r| !r.candidates.is_empty()) {
        out.push_str("\nCandidates, best first:\n");
        for (i, c) in route.candidates.iter().enumerate() {
            let _ = writeln!(
                out,
                "  {}. {} ({}) — {}",
                i + 1,
                c.id,
                c.ide_name,
                c.why.join("; ")
            );
        }
    }
    out.push_str(if r.ok {
        "\nEverything an agent needs to reach its editor works.\n"
    } else {
        "\nSomething above is in the way (✗); each has its fix.\n"
    });
    out
}

/// `doctor`: the report for `cwd` (and `session`'s sticky key), as text or JSON; exit status 1
/// when something needed does not work.
pub(super) async fn command(
    config_path: Option<PathBuf>,
    cwd: Option<PathBuf>,
    session: Option<String>,
    json: bool,
) -> anyhow::Result<std::process::ExitCode> {
    let cwd = super::cwd_or_current(cwd)?;
    let report = run(&Options {
        config_path,
        cwd,
        key: session,
    })
    .await;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report));
    }
    Ok(if report.ok {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service_line(enabled: &str, active: &str) -> Check {
        let mut b = Builder(Vec::new());
        systemd_unit_state(&mut b, "pi-ide-broker.service", enabled, active);
        b.0.pop().expect("one line")
    }

    #[test]
    fn the_service_line_always_ends_in_a_state_and_says_what_to_do() {
        let ok = service_line("enabled", "active");
        assert_eq!(ok.level, Level::Ok);
        assert!(ok.fix.is_none());
        for (en, act) in [
            ("disabled", ""),
            ("enabled", ""),
            ("disabled", "inactive"),
            ("enabled", "failed"),
        ] {
            let c = service_line(en, act);
            assert_eq!(c.level, Level::Warn, "{en} {act}");
            assert!(!c.message.trim_end().ends_with(','), "{}", c.message);
            assert!(
                c.fix.as_deref().is_some_and(|f| !f.is_empty()),
                "{en} {act}: no fix"
            );
        }
        assert!(service_line("enabled", "failed")
            .fix
            .unwrap_or_default()
            .contains("journalctl"));
        assert!(service_line("disabled", "inactive")
            .fix
            .unwrap_or_default()
            .contains("service install"));
    }

    /// A lockfile refused as another user's (writable by others, another uid's pid, another
    /// uid's listener on its port) gets the fix for that, not the broken-file one.
    #[test]
    fn a_lockfile_refused_as_another_users_gets_its_own_fix() {
        use crate::editor::Error;
        let path = Path::new("/home/u/.pi/ide/4242.lock");
        let fix = |e: Error| {
            let (level, fix) = lockfiles::fix_for(&e.to_string(), path);
            assert_eq!(level, Level::Fail, "{e}");
            fix
        };
        let writable = fix(Error::OthersMayWrite {
            mode: 0o620,
            path: path.to_path_buf(),
        });
        assert!(
            writable.contains("chmod 600 /home/u/.pi/ide/4242.lock"),
            "{writable}"
        );
        let pid = fix(Error::ForeignPid { pid: 1, uid: 0 });
        assert!(pid.contains("another user's process"), "{pid}");
        let port = fix(Error::ForeignListener {
            port: 4242,
            uid: 1001,
        });
        assert!(
            port.contains("another user's program holds port 4242")
                && port.contains("nothing was sent"),
            "{port}"
        );
    }
}
