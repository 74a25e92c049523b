//! The steps of `setup --undo`: what the record says setup did is taken back, each on its
//! own (one failing never stops the next), then what the broker itself left (`purge.rs`).

use super::background;
use super::mcp;
use super::record::{McpFile, Record};
use super::steps::{run, shown, write_atomic};
use super::{extension, Env, Level, Line, Options};
use crate::cli::service::{self, Manager};
use std::path::Path;

/// Takes back what the record says setup did; what fails stays in the record.
pub(super) fn undo(opts: &Options, env: &Env, rec: &mut Record, emit: &mut impl FnMut(Line)) {
    if *rec == Record::default() && !extension::dir(&env.data_dir).exists() {
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
    // The extension's folder goes once pi no longer loads it from there.
    let folder = extension::dir(&env.data_dir);
    if rec.pi_source.is_none() && folder.exists() {
        emit(undo_extension(opts, env, &folder));
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
    if let Some(link) = rec.command_link.clone() {
        emit(super::command::undo(opts, &link, rec));
    }
    if let Some(copy) = rec.binary_copy.clone() {
        emit(undo_binary(opts, &copy, rec));
    }
    let files = std::mem::take(&mut rec.mcp_files);
    for f in files {
        let (line, keep) = undo_file(opts, &f);
        emit(line);
        if keep {
            rec.mcp_files.push(f);
        }
    }
    if let Some(line) = undo_running(opts, env) {
        emit(line);
    }
}

/// The daemon still running (pi or an `mcp` door started it) is stopped too: nothing of
/// the broker keeps running after an uninstall (issue 52).
fn undo_running(opts: &Options, env: &Env) -> Option<Line> {
    let record = std::fs::read_to_string(env.state_dir.join("running.json")).ok()?;
    let pid = serde_json::from_str::<serde_json::Value>(&record).ok()?["pid"]
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())?;
    if opts.dry_run {
        return Some(Line::new(
            Level::Info,
            "daemon",
            format!("would stop the running daemon (pid {pid})"),
        ));
    }
    match background::stop(pid) {
        Ok(true) => Some(Line::new(
            Level::Ok,
            "daemon",
            format!("stopped the running daemon (pid {pid})"),
        )),
        Ok(false) => None,
        Err(e) => Some(Line::new(Level::Fail, "daemon", e).fix(format!("kill {pid}"))),
    }
}

fn undo_binary(opts: &Options, copy: &Path, rec: &mut Record) -> Line {
    if opts.dry_run {
        return Line::new(
            Level::Info,
            "binary",
            format!("would remove {}", copy.display()),
        );
    }
    match std::fs::remove_file(copy) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Line::new(
            Level::Fail,
            "binary",
            format!("cannot remove {}: {e}", copy.display()),
        )
        .fix(format!("remove it by hand: rm {}", copy.display())),
        _ => {
            rec.binary_copy = None;
            if let Some(dir) = copy.parent() {
                let _ = std::fs::remove_dir(dir);
            }
            Line::new(Level::Ok, "binary", format!("removed {}", copy.display()))
        }
    }
}

fn undo_extension(opts: &Options, env: &Env, folder: &Path) -> Line {
    if opts.dry_run {
        return Line::new(
            Level::Info,
            "pi",
            format!("would remove {}", folder.display()),
        );
    }
    match extension::remove(&env.data_dir) {
        Ok(()) => Line::new(Level::Ok, "pi", format!("removed {}", folder.display())),
        Err(e) => Line::new(
            Level::Fail,
            "pi",
            format!("cannot remove {}: {e}", folder.display()),
        )
        .fix(format!("remove it by hand: rm -r {}", folder.display())),
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
    match background::stop(pid) {
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
