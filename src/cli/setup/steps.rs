//! The steps of `setup`, each on its own: one failing never stops the next (`undo.rs` takes
//! them back).

use super::background;
use super::mcp::{self, FileClient};
use super::pi::{self, Source};
use super::record::{McpFile, Record};
use super::{extension, Env, Level, Line, Options, MIN_PI};
use crate::cli::service::{self, Manager};
use std::path::{Path, PathBuf};

/// Runs `cmd`; its output on success, else why it failed (the output's last lines).
pub(super) fn run(cmd: &[String], env: &Env, cwd: Option<&Path>) -> Result<String, String> {
    let (ok, text, status) = capture(cmd, env, cwd)?;
    if ok {
        return Ok(text);
    }
    Err(failed(cmd, &text, status))
}

/// Why `cmd` failed: its output's last lines (those not blank).
fn failed(cmd: &[String], text: &str, status: std::process::ExitStatus) -> String {
    let tail: Vec<&str> = text
        .lines()
        .rev()
        .filter(|l| !l.trim().is_empty())
        .take(4)
        .collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    format!(
        "`{}` failed ({status}): {}",
        cmd.join(" "),
        tail.join(" / ")
    )
}

/// Runs `cmd` to its end: whether it succeeded, its stdout and stderr, and its exit status.
fn capture(
    cmd: &[String],
    env: &Env,
    cwd: Option<&Path>,
) -> Result<(bool, String, std::process::ExitStatus), String> {
    let mut c = std::process::Command::new(&cmd[0]);
    c.args(&cmd[1..]).stdin(std::process::Stdio::null());
    if let Some(p) = &env.path {
        c.env("PATH", p);
    }
    if let Some(d) = cwd {
        c.current_dir(d);
    }
    let out = c
        .output()
        .map_err(|e| format!("cannot run `{}`: {e}", cmd[0]))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((out.status.success(), text, out.status))
}

pub(super) fn shown(cmds: &[service::Step]) -> String {
    cmds.iter()
        .map(service::Step::shown)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Every step of setup, in order.
pub(super) fn apply(opts: &Options, env: &Env, rec: &mut Record, emit: &mut impl FnMut(Line)) {
    let stable;
    let env = match binary_step(opts, env, rec) {
        Some((line, copy)) => {
            emit(line);
            stable = Env {
                exe: copy,
                ..env.clone()
            };
            &stable
        }
        None => env,
    };
    emit(super::command::step(opts, env, rec));
    emit(service_step(opts, env, rec));
    emit(pi_step(opts, env, rec));
    emit(claude_step(opts, env, rec));
    for client in mcp::FILE_CLIENTS {
        emit(file_step(client, opts, env, rec));
    }
}

/// A binary npm installed (inside a `node_modules` folder, which `pi update` replaces and
/// `pi remove` deletes) is copied to `<data dir>/bin/pi-ide-broker`, and the service, the
/// background daemon and the MCP entries run the copy; each setup run refreshes it. `None`
/// for a binary anywhere else (cargo's, a package manager's): it is used where it is.
fn binary_step(opts: &Options, env: &Env, rec: &mut Record) -> Option<(Line, PathBuf)> {
    if !from_npm(&env.exe) {
        return None;
    }
    let copy = env.data_dir.join("bin").join("pi-ide-broker");
    if opts.dry_run {
        let line = Line::new(
            Level::Info,
            "binary",
            format!("would copy {} to {}", env.exe.display(), copy.display()),
        );
        return Some((line, copy));
    }
    let same = std::fs::read(&copy)
        .ok()
        .zip(std::fs::read(&env.exe).ok())
        .is_some_and(|(a, b)| a == b);
    if !same {
        if let Err(e) = copy_executable(&env.exe, &copy) {
            let line = Line::new(
                Level::Fail,
                "binary",
                format!(
                    "cannot copy {} to {}: {e}",
                    env.exe.display(),
                    copy.display()
                ),
            )
            .fix("check that folder's permissions, then run setup again");
            return Some((line, env.exe.clone()));
        }
    }
    rec.binary_copy = Some(copy.clone());
    let what = if same {
        "is up to date"
    } else {
        "copied from npm's package"
    };
    let line = Line::new(
        Level::Ok,
        "binary",
        format!(
            "{} {what}: the service and MCP entries run it",
            copy.display()
        ),
    );
    Some((line, copy))
}

/// True for a binary npm installed (inside a `node_modules` folder).
fn from_npm(exe: &Path) -> bool {
    exe.components().any(|c| c.as_os_str() == "node_modules")
}

/// Copies `from` to `to` atomically (a running daemon keeps its old file), mode 0755.
fn copy_executable(from: &Path, to: &Path) -> std::io::Result<()> {
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = to.with_extension("new");
    std::fs::copy(from, &tmp)?;
    crate::platform::user::set_mode(&tmp, 0o755)?;
    std::fs::rename(&tmp, to)
}

/// Why no service manager can take the unit here, or `None` when one answers.
pub(super) fn no_manager(manager: Manager, env: &Env) -> Option<String> {
    service::no_manager(manager, env.path.as_deref())
}

fn service_step(opts: &Options, env: &Env, rec: &mut Record) -> Line {
    let manager = Manager::here();
    let unit = service::unit(
        manager,
        &env.exe,
        env.config.as_deref(),
        &env.home,
        &env.config_home,
    );
    let cmds = service::commands(manager, &unit, true);
    let on_disk = std::fs::read_to_string(&unit.path).ok();
    if on_disk.is_some() && rec.service_unit.is_none() {
        return Line::new(
            Level::Ok,
            "service",
            format!(
                "{} is installed already (by `service install`); left as it is",
                unit.path.display()
            ),
        );
    }
    if let Some(why) = no_manager(manager, env) {
        return background_daemon(opts, env, rec, &why);
    }
    if opts.dry_run {
        return Line::new(
            Level::Info,
            "service",
            format!(
                "would write {} and run: {}",
                unit.path.display(),
                shown(&cmds)
            ),
        );
    }
    let written = unit
        .path
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(&unit.path, &unit.content));
    if let Err(e) = written {
        return Line::new(
            Level::Fail,
            "service",
            format!("cannot write {}: {e}", unit.path.display()),
        )
        .fix("check that directory's permissions, then run setup again");
    }
    rec.service_unit = Some(unit.path.clone());
    if let Some(failed) = start_service(manager, &unit, &cmds, env) {
        return failed;
    }
    Line::new(
        Level::Ok,
        "service",
        format!(
            "{} installed, started, and starts at every login",
            unit.path.display()
        ),
    )
}

/// Runs the manager's commands for the written `unit` (and on Windows starts a daemon now:
/// the Run key starts it at the next logon only); the line to show when one failed.
fn start_service(
    manager: Manager,
    unit: &service::UnitFile,
    cmds: &[service::Step],
    env: &Env,
) -> Option<Line> {
    // A tolerated step (launchd's bootout of an agent not loaded) may fail; a required one
    // says what to do.
    for c in cmds {
        if let (Err(e), Some(fix)) = (run(&c.argv, env, None), &c.required) {
            return Some(
                Line::new(
                    Level::Fail,
                    "service",
                    format!("wrote {}, but {e}", unit.path.display()),
                )
                .fix(format!("{fix}; then run by hand: {}", shown(cmds))),
            );
        }
    }
    // The Run key starts it at the next logon only: start one now.
    if manager == Manager::RunKey && !background::answering(env) {
        if let Err(e) = background::start(env) {
            return Some(
                Line::new(
                    Level::Warn,
                    "service",
                    format!("{} installed for every logon, but {e}", unit.path.display()),
                )
                .fix(format!(
                    "run `{}`, or let the pi extension start it",
                    super::hint("daemon")
                )),
            );
        }
    }
    None
}

/// No service manager: a daemon in the background instead, unless one runs already.
fn background_daemon(opts: &Options, env: &Env, rec: &mut Record, why: &str) -> Line {
    let later = "when it stops (a reboot), the pi extension and the agents' `mcp` door start one whenever none runs";
    let head = format!("no user service manager answers here ({why})");
    if background::answering(env) {
        return Line::new(
            Level::Ok,
            "service",
            format!("{head}; a daemon is running on {}", env.socket.display()),
        )
        .fix(later);
    }
    if opts.dry_run {
        return Line::new(
            Level::Info,
            "service",
            format!(
                "{head}; would start `pi-ide-broker daemon` in the background (log: {})",
                background::log_path(env).display()
            ),
        );
    }
    match background::start(env) {
        Ok(pid) => {
            rec.daemon_pid = Some(pid);
            Line::new(
                Level::Ok,
                "service",
                format!(
                    "{head}; started a daemon in the background (pid {pid}, log: {})",
                    background::log_path(env).display()
                ),
            )
            .fix(later)
        }
        Err(e) => Line::new(Level::Warn, "service", format!("{head}; {e}")).fix(format!(
            "run `{}` in a terminal; {later}",
            super::hint("daemon")
        )),
    }
}

fn pi_step(opts: &Options, env: &Env, rec: &mut Record) -> Line {
    let source = Source::resolve(opts.pi_source.as_deref(), &env.data_dir);
    let by_hand = format!("pi install {}", source.arg());
    if env.which("pi").is_none() {
        return Line::new(
            Level::Warn,
            "pi",
            "pi is not on PATH: the extension was not installed",
        )
        .fix(format!(
            "install pi ({MIN_PI} or newer: npm install -g @earendil-works/pi-coding-agent), then run setup again"
        ));
    }
    let installed = pi::installed(&pi::settings_file(&env.home));
    let target = source.arg();
    if let Some(other) = installed.iter().find(|s| pi::is_ours(s) && **s != target) {
        let line = Line::new(
            Level::Ok,
            "pi",
            format!("pi loads the extension from {other}; left as it is"),
        );
        // This binary came with the package pi installed from npm: it is the same one, and
        // nothing is to switch (issue 52: the hint broke a working npm install).
        // (`env.exe` is setup's copy by now: `binary_copy` says it came from npm.)
        let npm_binary = from_npm(&env.exe) || rec.binary_copy.is_some();
        if npm_binary && other.starts_with("npm:") {
            return line;
        }
        // The folder the hint names exists before the hint is printed.
        if let Source::Bundled(dir) = &source {
            if opts.dry_run || extension::write(dir).is_err() {
                return line;
            }
        }
        return line.fix(format!(
            "to switch to this build's: pi remove {other} && {by_hand}"
        ));
    }
    if opts.dry_run {
        let write = match &source {
            Source::Bundled(dir) => format!("write the extension to {}; ", dir.display()),
            Source::Given(_) => String::new(),
        };
        let what = if installed.contains(&target) {
            format!("{write}check that pi loads it")
        } else {
            format!("{write}run: {by_hand}")
        };
        return Line::new(Level::Info, "pi", format!("would {what}"));
    }
    if let Source::Bundled(dir) = &source {
        if let Err(e) = extension::write(dir) {
            return Line::new(
                Level::Fail,
                "pi",
                format!("cannot write the extension to {}: {e}", dir.display()),
            )
            .fix("check that folder's permissions (or pass --pi-source), then run setup again");
        }
    }
    let already = installed.contains(&target);
    if !already {
        let cmd = ["pi".to_string(), "install".to_string(), target.clone()];
        if let Some(failure) = pi_install(&cmd, env) {
            return failure;
        }
        rec.pi_source = Some(target.clone());
    }
    pi_loads(env, &target, already)
}

/// Runs `pi install …`; the line to show when it failed (an old node named as the cause).
fn pi_install(cmd: &[String], env: &Env) -> Option<Line> {
    let (ok, out, status) = match capture(cmd, env, Some(&env.home)) {
        Ok(r) => r,
        Err(e) => return Some(Line::new(Level::Fail, "pi", e)),
    };
    if ok {
        return None;
    }
    if let Some((message, fix)) = pi::old_node_line(&out) {
        return Some(Line::new(Level::Fail, "pi", message).fix(fix));
    }
    Some(
        Line::new(Level::Fail, "pi", failed(cmd, &out, status))
            .fix("fix what pi says above, then run setup again"),
    )
}

/// Whether pi actually loads the extension: `pi --help` loads every installed one and lists
/// their flags (and prints a failed one's error), with no model and no session.
fn pi_loads(env: &Env, target: &str, already: bool) -> Line {
    let help = ["pi".to_string(), "--help".to_string()];
    // Read whatever its exit status: a refused extension's error is in the text.
    let out = match capture(&help, env, Some(&env.home)) {
        Ok((_, out, _)) => out,
        Err(e) => e,
    };
    if let Some((message, fix)) = pi::old_node_line(&out) {
        return Line::new(Level::Fail, "pi", message).fix(fix);
    }
    let verdict = pi::load_verdict(&out, target);
    match (verdict, already) {
        (Ok(()), true) => Line::new(
            Level::Ok,
            "pi",
            format!("the extension is installed ({target}) and pi loads it"),
        ),
        (Ok(()), false) => Line::new(
            Level::Ok,
            "pi",
            format!("installed the extension ({target}); pi loads it"),
        ),
        (Err(e), _) => Line::new(
            Level::Fail,
            "pi",
            format!("pi cannot load the extension from {target}: {e}"),
        )
        .fix(format!(
            "fix what pi says, then run setup again (`{}` takes it back)",
            super::hint("setup --undo")
        )),
    }
}

fn claude_step(opts: &Options, env: &Env, rec: &mut Record) -> Line {
    let add = mcp::claude_add(&env.broker_command());
    let line = add.join(" ");
    if rec.claude_mcp {
        return Line::new(
            Level::Ok,
            "Claude Code",
            "the `editor` MCP server was added by an earlier setup",
        );
    }
    if env.which("claude").is_none() {
        return Line::new(
            Level::Info,
            "Claude Code",
            format!("not on PATH; once it is: {line}"),
        );
    }
    match mcp::claude_entry(&env.home) {
        Some(e) if mcp::is_claude_entry(&e, &env.broker_command()) => {
            return Line::new(Level::Ok, "Claude Code", "has the `editor` MCP server");
        }
        Some(e) => {
            return Line::new(
                Level::Warn,
                "Claude Code",
                format!("has another `editor` MCP server ({e}); left as it is"),
            )
            .fix(format!(
                "to use the broker: claude mcp remove --scope user editor && {line}"
            ));
        }
        None => {}
    }
    if !opts.write || opts.dry_run {
        return Line::new(
            Level::Info,
            "Claude Code",
            format!("to add the MCP server: {line}"),
        )
        .fix("setup --write runs it");
    }
    match run(&add, env, Some(&env.home)) {
        Ok(_) => {
            rec.claude_mcp = true;
            Line::new(Level::Ok, "Claude Code", format!("added: {line}"))
        }
        Err(e) => Line::new(Level::Fail, "Claude Code", e).fix(format!("run it by hand: {line}")),
    }
}

fn file_step(client: FileClient, opts: &Options, env: &Env, rec: &mut Record) -> Line {
    let homes = env.homes();
    let file = client.file(&homes);
    let bin = env.broker_command();
    let snippet = client.snippet(&bin);
    let step = client.title();
    if !mcp::present(client, &homes, |c| env.which(c).is_some()) {
        return Line::new(
            Level::Info,
            step,
            format!(
                "not found here (no `{}`, no {}); once it is, add to {}: {snippet}",
                client.command(),
                file.parent()
                    .map_or(String::new(), |p| p.display().to_string()),
                file.display()
            ),
        );
    }
    let (text, plan) = match plan_file(client, &file, &bin) {
        Ok(tp) => tp,
        Err((level, why)) => {
            return Line::new(level, step, why).fix(format!("add by hand: {snippet}"));
        }
    };
    let (new_text, created_container) = match plan {
        mcp::Plan::Present => {
            return Line::new(
                Level::Ok,
                step,
                format!("{} has the `editor` MCP server", file.display()),
            )
        }
        mcp::Plan::Conflict(other) => {
            return Line::new(
                Level::Warn,
                step,
                format!(
                    "{} has another `editor` MCP server ({other}); left as it is",
                    file.display()
                ),
            )
            .fix(format!("to use the broker, make it: {snippet}"))
        }
        mcp::Plan::Write(t, c) => (t, c),
    };
    if !opts.write || opts.dry_run {
        return Line::new(
            Level::Info,
            step,
            format!("would add to {}: {snippet}", file.display()),
        )
        .fix("setup --write adds it");
    }
    if let Err(e) = write_atomic(&file, &new_text) {
        return Line::new(Level::Fail, step, e).fix(format!("add by hand: {snippet}"));
    }
    rec.mcp_files.push(McpFile {
        client: client.id().to_string(),
        file: file.clone(),
        created_file: text.is_none(),
        created_container,
        command: bin,
    });
    Line::new(
        Level::Ok,
        step,
        format!("added the `editor` MCP server to {}", file.display()),
    )
}

/// The file's text (`None`: no file yet) and what adding the entry to it comes to; or how bad
/// it is and why, when it cannot be read or edited safely.
fn plan_file(
    client: FileClient,
    file: &Path,
    bin: &str,
) -> Result<(Option<String>, mcp::Plan), (Level, String)> {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => Some(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err((Level::Fail, format!("cannot read {}: {e}", file.display()))),
    };
    match mcp::add(client, text.as_deref().unwrap_or(""), bin) {
        Ok(plan) => Ok((text, plan)),
        Err(e) => Err((
            Level::Warn,
            format!("{} cannot be edited safely: {e}", file.display()),
        )),
    }
}

/// Writes `text` to `path` through a temporary file beside it, keeping the file's mode.
pub(super) fn write_atomic(path: &Path, text: &str) -> Result<(), String> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let tmp = dir.join(format!(
        ".{}.pi-ide-broker-setup",
        path.file_name()
            .map_or("file".into(), |n| n.to_string_lossy())
    ));
    std::fs::write(&tmp, text).map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
    if let Ok(m) = std::fs::metadata(path) {
        let _ = std::fs::set_permissions(&tmp, m.permissions());
    }
    std::fs::rename(&tmp, path).map_err(|e| format!("cannot replace {}: {e}", path.display()))
}
