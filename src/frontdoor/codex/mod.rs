//! The codex door: Codex's `/ide` hub socket, served for the user's editors when no Codex app does.
//!
//! Codex's TUI (`/ide on`) asks, before each message, a per-user socket for the IDE context of
//! its cwd (`$TMPDIR/codex-ipc/ipc-<uid>.sock`; a pipe named `codex-ipc` on Windows, not served
//! yet). The Codex desktop app or VS Code extension normally runs that socket as a hub. When
//! none does, the broker serves it (`serve`): frames (`frame`) answered by `hub`, the context
//! of the editor the cwd routes to, mapped from its selection and open tabs (`context`).
//!
//! The socket is never stolen: a live one (it accepts a connection) is left to its owner,
//! whose going the door waits for; a dead one is replaced only when it is the user's. A
//! `codex-ipc` dir that is not the user's, or that group or others may write to, is refused,
//! as Codex refuses it. Who holds the socket is kept for `status` and `doctor` ([`hub_state`]).

mod config;
mod context;
mod door;
// The framing and the answers are served on Unix only (Codex's Windows pipe is not served yet).
#[cfg_attr(not(unix), allow(dead_code))]
mod frame;
#[cfg_attr(not(unix), allow(dead_code))]
mod hub;
#[cfg(unix)]
mod serve;

pub use config::CodexConfig;
pub use door::CodexDoor;

use crate::platform::sync::lock;
use crate::registry::Registry;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub use hub::ide_context;

/// Who holds Codex's hub socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HubOwner {
    /// This broker serves it.
    Broker,
    /// Another process (the Codex app or extension) serves it; the broker waits for it to go.
    Other,
    /// The broker refuses to serve there (a squatted dir, another user's socket).
    Refused,
}

/// The hub socket as `status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HubState {
    /// The socket path.
    pub socket: PathBuf,
    /// Who holds it.
    pub owner: HubOwner,
    /// In words: who the other process is, or why the broker refuses.
    pub detail: String,
}

/// The hub states of the doors running in this process, by socket (one per daemon).
static HUBS: Mutex<Vec<HubState>> = Mutex::new(Vec::new());

/// What the codex door running in this process knows of `socket`, if one runs for it.
pub fn hub_state(socket: &Path) -> Option<HubState> {
    lock(&HUBS).iter().find(|h| h.socket == socket).cloned()
}

/// Records who holds `socket`, and tells the registry that status changed.
fn record(reg: &Registry, socket: &Path, owner: HubOwner, detail: String) {
    {
        let mut hubs = lock(&HUBS);
        hubs.retain(|h| h.socket != socket);
        hubs.push(HubState {
            socket: socket.to_path_buf(),
            owner,
            detail,
        });
    }
    reg.changed();
}

#[cfg_attr(not(unix), allow(dead_code))]
fn forget(socket: &Path) {
    lock(&HUBS).retain(|h| h.socket != socket);
}

/// Runs the codex door on `socket` until the broker stops (or it refuses the place).
pub async fn run(reg: Arc<Registry>, socket: PathBuf) {
    #[cfg(unix)]
    serve::run(reg, socket).await;
    #[cfg(not(unix))]
    {
        let why = "Codex's /ide hub is a named pipe (codex-ipc) on Windows, which the broker does not serve yet";
        tracing::info!(socket = %socket.display(), "codex door off: {why}");
        record(&reg, &socket, HubOwner::Refused, why.into());
    }
}

/// Why the broker would refuse to serve in `dir` (Codex's own checks: the user's directory,
/// not a symlink, not writable by group or others); `None` when it may (or it does not exist
/// yet, and would be made 0700).
pub fn dir_problem(dir: &Path) -> Option<String> {
    let meta = match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => return Some(format!("cannot read {}: {e}", dir.display())),
        Ok(m) => m,
    };
    if !meta.is_dir() {
        return Some(format!(
            "{} is not a directory (a symlink or a file); remove it",
            dir.display()
        ));
    }
    let (uid, mode) = crate::platform::user::owner_and_mode(&meta)?;
    let me = crate::platform::user::uid();
    if uid != me {
        return Some(format!(
            "{} belongs to uid {uid}, not to you (uid {me}): another user could answer Codex there; remove it",
            dir.display()
        ));
    }
    let mode = mode & 0o777;
    if mode & 0o022 != 0 {
        return Some(format!(
            "{} is writable by group or others (mode {mode:04o}), which Codex refuses; run chmod 700 {}",
            dir.display(),
            dir.display()
        ));
    }
    None
}

/// How `doctor` rates the door.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    /// Served, or off by choice.
    Ok,
    /// Another hub serves Codex: the user's editors do not reach `/ide` through the broker.
    Warn,
    /// The broker refuses the place.
    Fail,
}

/// `doctor`'s check: how it stands, in words, and what to do (`hub`: what the daemon said).
pub fn diagnose(
    enabled: bool,
    socket: &Path,
    hub: Option<&HubState>,
) -> (Health, String, Option<String>) {
    if !enabled {
        let off = "the codex door is off ([codex] enabled = false)";
        return (Health::Ok, off.into(), None);
    }
    match hub {
        Some(h) => {
            let line = status_line(h);
            match h.owner {
                HubOwner::Broker => (Health::Ok, format!("{line} (run /ide on in Codex)"), None),
                HubOwner::Other => (Health::Warn, line, Some("quit that Codex app or extension for the broker to serve /ide from your editors: it takes the socket over when the other hub goes".into())),
                HubOwner::Refused => (Health::Fail, line, Some("fix what is said, then restart the daemon".into())),
            }
        }
        None => match socket.parent().and_then(dir_problem) {
            Some(why) => (
                Health::Fail,
                format!("Codex's /ide would not be served: {why}"),
                Some("the broker refuses a dir Codex itself refuses".into()),
            ),
            None => (
                Health::Ok,
                format!("Codex's /ide socket is {}", socket.display()),
                None,
            ),
        },
    }
}

/// One line on who holds the hub socket (`status`, `doctor`).
pub fn status_line(h: &HubState) -> String {
    match h.owner {
        HubOwner::Broker => format!("served by the broker at {}", h.socket.display()),
        HubOwner::Other => format!("{}: {}", h.socket.display(), h.detail),
        HubOwner::Refused => format!("not served at {}: {}", h.socket.display(), h.detail),
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn chmod(p: &Path, mode: u32) {
        crate::platform::user::set_mode(p, mode).unwrap();
    }

    /// Codex's checks of the socket's dir, made by the broker before it serves there.
    #[test]
    fn a_dir_others_can_write_or_that_is_no_dir_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("codex-ipc");
        assert_eq!(dir_problem(&dir), None, "missing: made 0700 when served");
        std::fs::create_dir(&dir).unwrap();
        chmod(&dir, 0o700);
        assert_eq!(dir_problem(&dir), None);
        chmod(&dir, 0o770);
        assert!(dir_problem(&dir).is_some_and(|w| w.contains("group or others")));
        chmod(&dir, 0o702);
        assert!(dir_problem(&dir).is_some_and(|w| w.contains("chmod 700")));
        let link = root.path().join("link");
        crate::platform::user::symlink(&dir, &link).unwrap();
        assert!(dir_problem(&link).is_some_and(|w| w.contains("not a directory")));
        // Another user's dir (root can hand it to nobody; others cannot make one).
        if crate::platform::user::uid() == 0 {
            chmod(&dir, 0o700);
            std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
            assert!(dir_problem(&dir).is_some_and(|w| w.contains("belongs to uid 65534")));
        }
    }

    #[test]
    fn the_state_is_kept_per_socket() {
        let dir = tempfile::tempdir().unwrap();
        let reg = Registry::new(
            Arc::new(crate::sys::config::Config::default()),
            crate::registry::state::StateStore::load(&dir.path().join("state")),
            dir.path().join("sock"),
            tokio_util::sync::CancellationToken::new(),
        );
        let changes = reg.subscribe_changes();
        let a = Path::new("/nowhere/a.sock");
        let b = Path::new("/nowhere/b.sock");
        record(&reg, a, HubOwner::Broker, String::new());
        assert!(changes.has_changed().unwrap(), "status watchers are woken");
        record(&reg, b, HubOwner::Other, "pid 1".into());
        record(&reg, a, HubOwner::Refused, "why".into());
        assert_eq!(hub_state(a).map(|h| h.owner), Some(HubOwner::Refused));
        assert_eq!(hub_state(b).map(|h| h.detail), Some("pid 1".into()));
        forget(a);
        forget(b);
        assert_eq!(hub_state(a), None);
    }
}
