//! The copilot door: GitHub Copilot CLI's IDE protocol, one lockfile and socket per editor.
//!
//! For every live editor, a Unix socket (0600) in the broker's private `copilot/` dir beside
//! its own socket, and a Copilot lockfile `<uuid>.lock` in Copilot CLI's ide dir
//! (`$COPILOT_HOME/ide`, default `~/.copilot/ide`) naming it, with a fresh nonce, the
//! editor's folders and `"<ideName> (via pi-ide-broker)"`; Copilot CLI's `/ide` lists it and
//! a CLI whose cwd is one of those folders connects by itself. The socket serves MCP over
//! Streamable HTTP (`http`), each MCP session a broker session pinned to the editor
//! (`session`), its tools mapped onto the editor's (`tools`).
//!
//! A lockfile is rewritten in place when its editor changes (Copilot CLI reads a rename as a
//! disconnect), removed as soon as the editor goes or restarts (a CLI then shows the
//! connection lost and waits, rather than clinging to a dead one; a successor, same id, gets a
//! fresh lockfile, socket and nonce, which a waiting CLI connects to) and when the broker stops; a dead broker's (marked, `lockfile`) are swept at
//! start. Files without the marker are never touched.

mod door;
mod http;
mod lockfile;
mod session;
mod tools;

pub use door::{CopilotDoor, DOOR_ID};

use crate::editor::Editor;
use crate::registry::{EditorEvent, Registry};
use crate::sys::secret::Token;
use http::Endpoint;
use lockfile::Published;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use tokio_util::sync::CancellationToken;

/// One editor's published endpoint.
struct Entry {
    /// The editor handle it was published for: a successor (a restart of the same editor,
    /// with the same id) is a new handle, and gets a fresh endpoint.
    editor: Weak<Editor>,
    lock: PathBuf,
    socket: PathBuf,
    nonce: Token,
    timestamp: u64,
    stop: CancellationToken,
}

impl Entry {
    fn published(&self) -> Published<'_> {
        Published {
            socket: &self.socket,
            nonce: &self.nonce,
            timestamp: self.timestamp,
        }
    }

    /// Whether it still stands for the live editor `id` (the same handle, not gone, not a
    /// successor).
    fn current(&self, reg: &Registry, id: &str) -> bool {
        reg.editor(id)
            .is_some_and(|e| Weak::ptr_eq(&self.editor, &Arc::downgrade(&e)))
    }

    /// Stops its listener and sessions, removes its lockfile and socket.
    fn withdraw(&self) {
        self.stop.cancel();
        let _ = std::fs::remove_file(&self.lock);
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Runs the copilot door until the broker stops: `dir` is Copilot CLI's ide dir, `sockets`
/// the broker's private dir for the door's sockets.
pub async fn run(reg: Arc<Registry>, dir: PathBuf, sockets: PathBuf) {
    for d in [&dir, &sockets] {
        if let Err(e) = crate::platform::local::secure_dir(d) {
            tracing::error!(dir = %d.display(), error = %e, "copilot door disabled");
            return;
        }
    }
    lockfile::clean_leftovers(&dir);
    let mut events = reg.subscribe_editors();
    let mut changes = reg.subscribe_changes();
    let mut entries: HashMap<String, Entry> = HashMap::new();
    loop {
        let ev = tokio::select! {
            _ = reg.cancel.cancelled() => break,
            ev = events.recv() => match ev { Some(e) => e, None => break },
            Ok(()) = changes.changed() => {
                withdraw_stale(&reg, &mut entries);
                continue;
            }
        };
        match ev {
            EditorEvent::Ready(id) => {
                withdraw_stale(&reg, &mut entries);
                if let Some(e) = entries.get(&id) {
                    if let Err(err) = write(&reg, &id, e) {
                        tracing::warn!(editor = %id, error = %err, "cannot rewrite the copilot lockfile");
                    }
                    continue;
                }
                match publish(&reg, &id, &dir, &sockets).await {
                    Ok(e) => {
                        tracing::info!(editor = %id, file = %e.lock.display(), "copilot lockfile published");
                        entries.insert(id, e);
                    }
                    Err(err) => {
                        tracing::warn!(editor = %id, error = %err, "cannot publish a copilot lockfile")
                    }
                }
            }
            EditorEvent::Gone(id) => {
                if let Some(e) = entries.remove(&id) {
                    tracing::info!(editor = %id, file = %e.lock.display(), "copilot lockfile withdrawn");
                    e.withdraw();
                }
            }
        }
    }
    for e in entries.values() {
        e.withdraw();
    }
}

/// Withdraws the entries whose editor went (at once, not after its grace period) or was
/// succeeded: Copilot CLI only notices a lockfile removed (rewritten in place, it clings to
/// its MCP session on a server that no longer knows it), so it shows the connection lost and
/// connects afresh to the successor's new lockfile, socket and nonce.
fn withdraw_stale(reg: &Registry, entries: &mut HashMap<String, Entry>) {
    entries.retain(|id, e| {
        let keep = e.current(reg, id);
        if !keep {
            tracing::info!(editor = %id, file = %e.lock.display(), "copilot lockfile withdrawn (editor gone or restarted)");
            e.withdraw();
        }
        keep
    });
}

/// Binds the editor's socket, writes its lockfile and starts serving.
async fn publish(
    reg: &Arc<Registry>,
    id: &str,
    dir: &Path,
    sockets: &Path,
) -> std::io::Result<Entry> {
    let Some(editor) = reg.editor(id) else {
        return Err(std::io::Error::other("the editor is gone"));
    };
    let name = lockfile::fresh_name()?;
    let stem = name.trim_end_matches(".lock");
    let socket = sockets.join(format!("{stem}.sock"));
    let listener = crate::platform::local::bind(&socket)
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let entry = Entry {
        editor: Arc::downgrade(&editor),
        lock: dir.join(&name),
        socket,
        nonce: Token::generate()?,
        timestamp: now,
        stop: reg.accepting.child_token(),
    };
    let endpoint = Endpoint::new(
        reg.clone(),
        id.to_string(),
        entry.nonce.clone(),
        entry.stop.clone(),
    );
    reg.tracker
        .spawn(http::accept_loop(Arc::new(endpoint), listener));
    if let Err(e) = write(reg, id, &entry) {
        entry.withdraw();
        return Err(e);
    }
    Ok(entry)
}

/// Writes (in place) the lockfile of `entry` for editor `id` as it is now.
fn write(reg: &Registry, id: &str, entry: &Entry) -> std::io::Result<()> {
    let Some(body) = lockfile::body(reg, id, &entry.published()) else {
        return Err(std::io::Error::other("the editor is gone"));
    };
    lockfile::write_in_place(&entry.lock, &body)
}

/// The cwd of a session's process: the peer's (`pid`, from the kernel) where readable, else
/// the editor's first folder.
pub(crate) fn cwd_of(reg: &Registry, editor: &str, pid: Option<u32>) -> String {
    #[cfg(target_os = "linux")]
    if let Some(cwd) = pid.and_then(|p| std::fs::read_link(format!("/proc/{p}/cwd")).ok()) {
        return cwd.display().to_string();
    }
    let _ = pid;
    reg.editor(editor)
        .and_then(|e| e.folders.first().map(|f| f.display().to_string()))
        .unwrap_or_else(|| "/".into())
}

/// The door's lockfiles in `dir` (for `status` and `doctor`): path and the editor it stands for.
pub fn list_ours(dir: &Path) -> Vec<(PathBuf, String)> {
    lockfile::list(dir)
        .into_iter()
        .filter_map(|(name, v)| {
            let v = v?;
            let editor = v
                .get(crate::frontdoor::per_editor::MARKER)?
                .get("editor")?
                .as_str()?
                .to_string();
            Some((dir.join(name), editor))
        })
        .collect()
}
