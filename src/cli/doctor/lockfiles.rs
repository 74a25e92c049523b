//! The lock dirs' and lockfiles' checks: each lockfile's verdict, and the fix for a refusal.

use super::{mode_of, Builder, Level};
use crate::editor::Error as LockfileError;
use crate::frontdoor::status::{EditorStatus, Status};
use crate::registry::lifecycle::lockfile;
use crate::sys::config::LockDirConfig;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub(super) async fn check_lock_dir(b: &mut Builder, dir: &LockDirConfig, status: Option<&Status>) {
    let what = format!("lock dir {}", dir.path.display());
    let me = crate::platform::user::uid();
    match mode_of(&dir.path) {
        None => {
            b.add(
                what,
                Level::Warn,
                format!(
                    "does not exist yet ({} family): no editor has written here",
                    dir.family
                ),
            );
            return;
        }
        Some((mode, _)) if mode & 0o002 != 0 => b.fix(
            what,
            Level::Fail,
            format!("writable by every user (mode {mode:04o}); their lockfiles are refused"),
            format!("chmod 700 {}", dir.path.display()),
        ),
        Some((mode, uid)) if uid != me => b.fix(
            what,
            Level::Warn,
            format!("owned by uid {uid}, not us (mode {mode:04o}): was it created with sudo?"),
            format!("sudo chown $USER {}", dir.path.display()),
        ),
        Some((mode, _)) => b.add(
            what,
            Level::Ok,
            format!("{} family, mode {mode:04o}, ours", dir.family),
        ),
    }
    let Ok(entries) = std::fs::read_dir(&dir.path) else {
        return;
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(".lock"))
        })
        .collect();
    files.sort();
    for f in files {
        check_lockfile(b, &f, dir, status).await;
    }
}

/// The verdict for a known editor whose link state says it all (ready, unhealthy, taken);
/// false when the state needs looking into.
fn link_verdict(
    b: &mut Builder,
    what: &str,
    e: &crate::frontdoor::status::EditorStatus,
    state: &str,
) -> bool {
    if state == "ready" || state == "unhealthy" {
        let level = if state == "ready" {
            Level::Ok
        } else {
            Level::Warn
        };
        b.add(
            what.to_string(),
            level,
            format!(
                "{} {} (pid {}, port {}) is {state}: editor {}{}",
                e.ide_name,
                e.workspace_folders.join(", "),
                e.pid,
                e.port,
                e.id,
                if e.no_token {
                    " (no token: the editor asks for none)"
                } else {
                    ""
                }
            ),
        );
        return true;
    }
    if state == "taken" {
        b.fix(
                what.to_string(),
                Level::Warn,
                format!(
                    "{} (pid {}, port {}) is taken: {}",
                    e.ide_name,
                    e.pid,
                    e.port,
                    e.state_reason.as_deref().unwrap_or("another client holds it")
                ),
                "nothing to do: the broker connects again when one of its sessions calls the editor or the other client leaves; [editors] single_client = \"take\" makes it fight for the editor instead",
            );
        return true;
    }
    false
}

async fn check_lockfile(
    b: &mut Builder,
    path: &Path,
    dir: &LockDirConfig,
    status: Option<&Status>,
) {
    let what = format!("lockfile {}", path.display());
    let editor = status.and_then(|s| s.editors.iter().find(|e| e.lockfile == path));
    if let Some(e) = editor {
        let state = serde_json::to_value(e.state)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default();
        if link_verdict(b, &what, e, &state) {
            return;
        }
        unlinked_verdict(b, what, e, &state).await;
        return;
    }
    let remembered = status.and_then(|s| s.lockfiles_rejected.iter().find(|r| r.path == path));
    let reason = match lockfile::read(path, dir.family) {
        Ok(_) => match remembered {
            Some(r) => Some(r.reason.clone()),
            None if status.is_none() => None,
            None => Some("not (yet) taken by the daemon".into()),
        },
        Err(LockfileError::NotALockfile) => return,
        // The daemon's word wins over a read of a file still being written.
        Err(e) if e.is_transient() => Some(
            remembered
                .map(|r| r.reason.clone())
                .unwrap_or_else(|| e.to_string()),
        ),
        Err(e) => Some(e.to_string()),
    };
    match reason {
        None => b.add(
            what,
            Level::Ok,
            "a valid lockfile (the daemon is not running to use it)",
        ),
        Some(r) => {
            let (level, fix) = fix_for(&r, path);
            b.fix(what, level, r, fix);
        }
    }
}

/// A known editor that is not linked: why, found by trying its port (1 s at most).
async fn unlinked_verdict(b: &mut Builder, what: String, e: &EditorStatus, state: &str) {
    let open = tokio::time::timeout(
        Duration::from_secs(1),
        tokio::net::TcpStream::connect(("127.0.0.1", e.port)),
    )
    .await
    .is_ok_and(|r| r.is_ok());
    let (detail, fix) = match (open, e.no_token) {
        (true, true) => (
            format!(
                "port {} answers but the link is {state}: its lockfile has no token and the editor refused the handshake",
                e.port
            ),
            "restart the editor's IDE server; if it wants a token, it must write one into its lockfile",
        ),
        (true, false) => (
            format!(
                "port {} answers but the link is {state}: the editor refused our token or the handshake",
                e.port
            ),
            "restart the editor's IDE server (its lockfile is rewritten with a fresh token)",
        ),
        (false, _) => (
            format!("port {} is closed (pid {} runs)", e.port, e.pid),
            "the editor's server stopped; restart it (e.g. :PiStart in Neovim) or the editor",
        ),
    };
    b.fix(what, Level::Fail, detail, fix);
}

/// What to do about a refused lockfile, and whether it is in the way.
pub(super) fn fix_for(reason: &str, path: &Path) -> (Level, String) {
    let p = path.display();
    if reason.contains("writable by group or others") {
        return (
            Level::Fail,
            format!("only you may write a lockfile (whoever can may send the editor's token elsewhere): chmod 600 {p}; if the editor writes it so again, run it with umask 077"),
        );
    }
    if reason.contains("is listened on by uid") {
        let port = lockfile::port_from_name(path).map_or_else(|_| "?".into(), |p| p.to_string());
        return (
            Level::Fail,
            format!("another user's program holds port {port}, so this lockfile's editor is not yours (or is not running): nothing was sent to it. See whose: ss -ltne 'sport = :{port}'; restart your editor's IDE server, or remove the file: rm {p}"),
        );
    }
    if reason.contains("belongs to uid") {
        return (
            Level::Fail,
            format!("the pid it names is another user's process, not your editor: remove it (rm {p}) and restart your editor's IDE server"),
        );
    }
    if reason.contains("not running") || reason.contains("recycled") {
        (
            Level::Warn,
            format!("a crashed editor left it; harmless, or remove it: rm {p}"),
        )
    } else if reason.contains("owned by uid") {
        (
            Level::Fail,
            format!("the editor ran as another user (sudo?); run it as yourself, or sudo chown $USER {p}"),
        )
    } else if reason.contains("symlink") {
        (
            Level::Fail,
            format!("symlinks are refused; have the editor write the file itself (rm {p})"),
        )
    } else if reason.contains("bytes") {
        (
            Level::Fail,
            format!("not a real lockfile; remove it: rm {p}"),
        )
    } else {
        (
            Level::Fail,
            format!("the editor wrote a broken lockfile; restart its IDE server, or rm {p}"),
        )
    }
}
