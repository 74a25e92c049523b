//! The steps of `setup` and of `setup --undo`, each on its own: one failing never stops the
//! next.

use super::daemon;
use super::mcp::{self, FileClient};
use super::pi::{self, Source};
use super::record::{McpFile, Record};
use super::{Env, Level, Line, Options};
use crate::service::{self, Manager};
use std::path::Path;

/// Runs `cmd`; its output on success, else why it failed (the output's last lines).
fn run(cmd: &[String], env: &Env, cwd: Option<&Path>) -> Result<String, String> {
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
    if out.status.success() {
        return Ok(text);
    }
    let tail: Vec<&str> = text.lines().rev().take(4).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    Err(format!(
        "`{}` failed ({}): {}",
        cmd.join(" "),
        out.status,
        tail.join(" / ")
    ))
}

fn shown(cmds: &[service::Step]) -> String {
    cmds.iter()
        .map(service::Step::shown)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Every step of setup, in order.
pub fn apply(opts: &Options, env: &Env, rec: &mut Record, emit: &mut impl FnMut(Line)) {
    emit(service_step(opts, env, rec));
    emit(pi_step(opts, env, rec));
    emit(claude_step(opts, env, rec));
    for client in mcp::FILE_CLIENTS {
        emit(file_step(client, opts, env, rec));
    }
}

/// Why no service manager can take the unit here, or `None` when one answers.
fn no_manager(manager: Manager, env: &Env) -> Option<String> {
    let probe: Vec<String> = match manager {
        Manager::Systemd => ["systemctl", "--user", "show-environment"],
        Manager::Launchd => ["launchctl", "managername", ""],
    }
    .iter()
    .filter(|s| !s.is_empty())
    .map(|s| s.to_string())
    .collect();
    run(&probe, env, None).err()
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
    // A tolerated step (launchd's bootout of an agent not loaded) may fail; a required one
    // says what to do.
    for c in &cmds {
        if let (Err(e), Some(fix)) = (run(&c.argv, env, None), &c.required) {
            return Line::new(
                Level::Fail,
                "service",
                format!("wrote {}, but {e}", unit.path.display()),
            )
            .fix(format!("{fix}; then run by hand: {}", shown(&cmds)));
        }
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

/// No service manager: a daemon in the background instead, unless one runs already.
fn background_daemon(opts: &Options, env: &Env, rec: &mut Record, why: &str) -> Line {
    let later = "when it stops (a reboot), the pi extension and `pi-ide-broker mcp` start one whenever none runs";
    let head = format!("no user service manager answers here ({why})");
    if daemon::answering(env) {
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
                daemon::log_path(env).display()
            ),
        );
    }
    match daemon::start(env) {
        Ok(pid) => {
            rec.daemon_pid = Some(pid);
            Line::new(
                Level::Ok,
                "service",
                format!(
                    "{head}; started a daemon in the background (pid {pid}, log: {})",
                    daemon::log_path(env).display()
                ),
            )
            .fix(later)
        }
        Err(e) => Line::new(Level::Warn, "service", format!("{head}; {e}"))
            .fix(format!("run `pi-ide-broker daemon` in a terminal; {later}")),
    }
}

fn pi_step(opts: &Options, env: &Env, rec: &mut Record) -> Line {
    let source = pi::resolve(opts.pi_source.as_deref(), &env.exe, &env.manifest_dir);
    let by_hand = source.as_ref().map_or(
        "pi install git:<this repository's URL>@<tag>".to_string(),
        |s| format!("pi install {}", s.arg()),
    );
    if env.which("pi").is_none() {
        return Line::new(
            Level::Warn,
            "pi",
            "pi is not on PATH: the extension was not installed",
        )
        .fix(format!(
            "with pi 1.6 installed, run setup again, or: {by_hand}"
        ));
    }
    let installed = pi::installed(&pi::settings_file(&env.home));
    let Some(source) = source else {
        return Line::new(
            Level::Fail,
            "pi",
            "cannot tell which repository this build came from",
        )
        .fix("pass it: pi-ide-broker setup --pi-source git:<url>@<tag>");
    };
    if installed.contains(&source.arg()) {
        return Line::new(
            Level::Ok,
            "pi",
            format!("the extension is installed ({})", source.arg()),
        );
    }
    // Another ref of the same repository is an older (or newer) extension: this build's
    // replaces it. Anything else (a checkout, another URL) is the user's choice.
    let target = source.arg();
    let same_repo = installed
        .iter()
        .find(|s| s.contains('@') && pi::without_ref(s) == pi::without_ref(&target))
        .cloned();
    if let Some(other) = installed
        .iter()
        .find(|s| pi::is_ours(s) && Some(*s) != same_repo.as_ref())
    {
        return Line::new(
            Level::Ok,
            "pi",
            format!("pi loads the extension from {other}; left as it is"),
        )
        .fix(format!(
            "to switch to this build's: pi remove {other} && {by_hand}"
        ));
    }
    if opts.dry_run {
        let first = same_repo
            .as_ref()
            .map_or(String::new(), |o| format!("pi remove {o}; "));
        return Line::new(Level::Info, "pi", format!("would run: {first}{by_hand}"));
    }
    pi_install(&source, same_repo.as_deref(), env, rec, &by_hand)
}

/// Installs `source` (after removing `replacing`, another ref of it), and records it.
fn pi_install(
    source: &Source,
    replacing: Option<&str>,
    env: &Env,
    rec: &mut Record,
    by_hand: &str,
) -> Line {
    if let Source::Checkout(dir) = source {
        if let Err(e) = checkout_deps(dir, env) {
            return Line::new(Level::Fail, "pi", e).fix(format!(
                "run `npm install --omit=dev --legacy-peer-deps` in {}, then setup again",
                dir.display()
            ));
        }
    }
    if let Some(old) = replacing {
        if let Err(e) = run(
            &["pi".into(), "remove".into(), old.to_string()],
            env,
            Some(&env.home),
        ) {
            return Line::new(Level::Fail, "pi", e).fix(format!("pi remove {old} && {by_hand}"));
        }
    }
    let cmd = ["pi".to_string(), "install".to_string(), source.arg()];
    match run(&cmd, env, Some(&env.home)) {
        Ok(_) => {
            rec.pi_source = Some(source.arg());
            let was = replacing.map_or(String::new(), |o| format!(" (replacing {o})"));
            Line::new(
                Level::Ok,
                "pi",
                format!("installed the extension: {by_hand}{was}"),
            )
        }
        Err(e) => Line::new(Level::Fail, "pi", e).fix(format!(
            "fix what pi says, then run setup again, or: {by_hand}"
        )),
    }
}

/// A checkout is loaded where it is, and pi installs nothing for it: `ws` must be there.
fn checkout_deps(dir: &Path, env: &Env) -> Result<(), String> {
    if dir.join("node_modules").join("ws").exists() {
        return Ok(());
    }
    let cmd = [
        "npm",
        "install",
        "--omit=dev",
        "--legacy-peer-deps",
        "--no-audit",
        "--no-fund",
    ]
    .map(String::from);
    run(&cmd, env, Some(dir)).map(|_| ())
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
fn write_atomic(path: &Path, text: &str) -> Result<(), String> {
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

/// Takes back what the record says setup did; what fails stays in the record.
pub fn undo(opts: &Options, env: &Env, rec: &mut Record, emit: &mut impl FnMut(Line)) {
    if *rec == Record::default() {
        emit(Line::new(
            Level::Ok,
            "undo",
            "setup has changed nothing here; nothing to undo",
        ));
        return;
    }
    if let Some(unit) = rec.service_unit.clone() {
        emit(undo_service(opts, env, &unit, rec));
    }
    if let Some(pid) = rec.daemon_pid {
        emit(undo_daemon(opts, pid, rec));
    }
    if let Some(source) = rec.pi_source.clone() {
        emit(undo_command(
            opts,
            env,
            "pi",
            &["pi".into(), "remove".into(), source],
            &mut rec.pi_source,
        ));
    }
    if rec.claude_mcp {
        let mut flag = Some(());
        emit(undo_command(
            opts,
            env,
            "Claude Code",
            &mcp::claude_remove(),
            &mut flag,
        ));
        rec.claude_mcp = flag.is_some();
    }
    let files = std::mem::take(&mut rec.mcp_files);
    for f in files {
        let (line, keep) = undo_file(opts, &f);
        emit(line);
        if keep {
            rec.mcp_files.push(f);
        }
    }
}

fn undo_service(opts: &Options, env: &Env, unit_path: &Path, rec: &mut Record) -> Line {
    let manager = Manager::here();
    let unit = service::unit(manager, &env.exe, None, &env.home, &env.config_home);
    let cmds = service::commands(manager, &unit, false);
    if opts.dry_run {
        return Line::new(
            Level::Info,
            "service",
            format!(
                "would run: {}; would remove {}",
                shown(&cmds),
                unit_path.display()
            ),
        );
    }
    // Stopping a service that is not running fails; removing the unit is what counts.
    for c in &cmds {
        let _ = run(&c.argv, env, None);
    }
    match std::fs::remove_file(unit_path) {
        Ok(()) => {
            rec.service_unit = None;
            Line::new(
                Level::Ok,
                "service",
                format!("stopped and removed {}", unit_path.display()),
            )
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            rec.service_unit = None;
            Line::new(
                Level::Ok,
                "service",
                format!("{} was removed already", unit_path.display()),
            )
        }
        Err(e) => Line::new(
            Level::Fail,
            "service",
            format!("cannot remove {}: {e}", unit_path.display()),
        )
        .fix("remove it by hand, then `systemctl --user daemon-reload`"),
    }
}

fn undo_daemon(opts: &Options, pid: u32, rec: &mut Record) -> Line {
    if opts.dry_run {
        return Line::new(
            Level::Info,
            "service",
            format!("would stop the daemon setup started (pid {pid})"),
        );
    }
    match daemon::stop(pid) {
        Ok(stopped) => {
            rec.daemon_pid = None;
            let what = if stopped {
                "stopped"
            } else {
                "no longer runs:"
            };
            Line::new(
                Level::Ok,
                "service",
                format!("{what} the daemon setup started (pid {pid})"),
            )
        }
        Err(e) => Line::new(Level::Fail, "service", e).fix(format!("kill {pid}")),
    }
}

/// Runs an undo command; clears `done` when it worked.
fn undo_command<T>(
    opts: &Options,
    env: &Env,
    step: &str,
    cmd: &[String],
    done: &mut Option<T>,
) -> Line {
    let line = cmd.join(" ");
    if opts.dry_run {
        return Line::new(Level::Info, step, format!("would run: {line}"));
    }
    match run(cmd, env, Some(&env.home)) {
        Ok(_) => {
            *done = None;
            Line::new(Level::Ok, step, format!("ran: {line}"))
        }
        Err(e) => Line::new(Level::Fail, step, e).fix(format!("run it by hand: {line}")),
    }
}

/// Removes one recorded entry; whether to keep it in the record (it failed).
fn undo_file(opts: &Options, f: &McpFile) -> (Line, bool) {
    let Some(client) = mcp::FILE_CLIENTS.into_iter().find(|c| c.id() == f.client) else {
        return (
            Line::new(
                Level::Warn,
                &f.client,
                "a client this version does not know; left in the record",
            ),
            true,
        );
    };
    let step = client.title();
    let Ok(text) = std::fs::read_to_string(&f.file) else {
        return (
            Line::new(
                Level::Ok,
                step,
                format!("{} is gone already", f.file.display()),
            ),
            false,
        );
    };
    let new_text = match mcp::remove(client, &text, &f.command, f.created_container) {
        Ok(Some(t)) => t,
        Ok(None) => {
            return (
                Line::new(
                    Level::Ok,
                    step,
                    format!("{} no longer has the entry", f.file.display()),
                ),
                false,
            )
        }
        Err(e) => {
            return (
                Line::new(Level::Warn, step, format!("{}: {e}", f.file.display())),
                false,
            )
        }
    };
    if opts.dry_run {
        return (
            Line::new(
                Level::Info,
                step,
                format!(
                    "would remove the `editor` MCP server from {}",
                    f.file.display()
                ),
            ),
            true,
        );
    }
    let result = if f.created_file && mcp::is_empty(client, &new_text) {
        std::fs::remove_file(&f.file)
            .map_err(|e| format!("cannot remove {}: {e}", f.file.display()))
    } else {
        write_atomic(&f.file, &new_text)
    };
    match result {
        Ok(()) => (
            Line::new(
                Level::Ok,
                step,
                format!("removed the `editor` MCP server from {}", f.file.display()),
            ),
            false,
        ),
        Err(e) => (
            Line::new(Level::Fail, step, e).fix("remove the `editor` entry by hand"),
            true,
        ),
    }
}
