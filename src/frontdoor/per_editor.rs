//! An endpoint published per live editor: the loop the compat and gemini doors share.
//!
//! A door may want only some editors (`PerEditor::wants`: the Claude lockfiles go only to
//! editors that write none of their own). On an editor's `Ready` a loopback listener is bound and the door writes its discovery files;
//! a successor (same id) keeps port and token and has its files rewritten; `Gone` withdraws the
//! entry (listener stopped, files removed), as the broker's stop withdraws every one. A dead
//! broker's leftovers carry our marker and its pid, and are cleaned at start; a file without
//! the marker is never touched.

use crate::registry::{EditorEvent, Registry};
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The field that marks a file as written by a pi-ide-broker (the lock dir watcher skips
/// such files, so a broker never dials itself).
pub(crate) const MARKER: &str = "piIdeBroker";

/// One editor's published endpoint: its port, the files that announce it, and the token that
/// stops its listener. `door` is what the door keeps besides.
pub(crate) struct Entry<T> {
    /// The loopback port the listener is on.
    pub port: u16,
    /// The files written for it, removed when it is withdrawn.
    pub files: Vec<PathBuf>,
    /// Cancelled when it is withdrawn: its accept loop ends.
    pub stop: CancellationToken,
    /// The door's own part (its token, …).
    pub door: T,
}

/// A door that publishes one endpoint per editor.
pub(crate) trait PerEditor {
    /// What the door keeps per entry besides the port, files and stop token.
    type Door;
    /// What an entry is called in log lines ("compat entry").
    const WHAT: &'static str;
    /// Publishes for a new editor `id`: `listener` is bound on `port`; write the files and
    /// spawn the accept loop, which ends when `stop` is cancelled.
    fn publish(
        &self,
        reg: &Arc<Registry>,
        id: &str,
        listener: TcpListener,
        stop: CancellationToken,
    ) -> std::io::Result<Entry<Self::Door>>;
    /// Rewrites the files of `entry` for editor `id` as it is now (a successor's folders,
    /// name, pid).
    fn refresh(
        &self,
        reg: &Registry,
        id: &str,
        entry: &mut Entry<Self::Door>,
    ) -> std::io::Result<()>;
    /// Whether editor `id` gets an entry now (asked again on every change the registry
    /// records: an entry no longer wanted is withdrawn, one wanted again is published).
    /// Default: every editor.
    fn wants(&self, _reg: &Registry, _id: &str) -> bool {
        true
    }
}

/// Follows the registry's editor events until the broker stops, then withdraws every entry.
/// An editor the door does not want ([`PerEditor::wants`]) is set aside, and looked at again
/// on every change the registry records, as every entry is.
pub(crate) async fn run<D: PerEditor>(reg: Arc<Registry>, door: D) {
    let mut events = reg.subscribe_editors();
    let mut changes = reg.subscribe_changes();
    let mut entries = Entries::<D> {
        live: HashMap::new(),
        skipped: HashSet::new(),
    };
    loop {
        tokio::select! {
            _ = reg.cancel.cancelled() => break,
            ev = events.recv() => match ev {
                Some(EditorEvent::Ready(id)) => entries.ready(&reg, &door, id),
                Some(EditorEvent::Gone(id)) => entries.gone(&id),
                None => break,
            },
            Ok(()) = changes.changed() => entries.reconcile(&reg, &door),
        }
    }
    for e in entries.live.values() {
        withdraw(e);
    }
}

/// The entries of one door: published, and set aside (live editors it does not want now).
struct Entries<D: PerEditor> {
    live: HashMap<String, Entry<D::Door>>,
    skipped: HashSet<String>,
}

impl<D: PerEditor> Entries<D> {
    /// Editor `id` is ready: a successor's entry is refreshed, a new editor published.
    fn ready(&mut self, reg: &Arc<Registry>, door: &D, id: String) {
        if let Some(e) = self.live.get_mut(&id) {
            if let Err(err) = door.refresh(reg, &id, e) {
                tracing::warn!(editor = %id, error = %err, "cannot refresh the {}", D::WHAT);
            }
            return;
        }
        if !door.wants(reg, &id) {
            self.skipped.insert(id);
            return;
        }
        self.skipped.remove(&id);
        self.publish(reg, door, id);
    }

    fn publish(&mut self, reg: &Arc<Registry>, door: &D, id: String) {
        match publish(reg, door, &id) {
            Ok(entry) => {
                tracing::info!(editor = %id, port = entry.port, file = %entry.files.first().map(|f| f.display().to_string()).unwrap_or_default(), "{} published", D::WHAT);
                self.live.insert(id, entry);
            }
            Err(e) => tracing::warn!(editor = %id, error = %e, "cannot publish the {}", D::WHAT),
        }
    }

    fn gone(&mut self, id: &str) {
        self.skipped.remove(id);
        if let Some(e) = self.live.remove(id) {
            tracing::info!(editor = %id, port = e.port, "{} withdrawn", D::WHAT);
            withdraw(&e);
        }
    }

    /// Withdraws the entries the door no longer wants, publishes those set aside it wants now.
    fn reconcile(&mut self, reg: &Arc<Registry>, door: &D) {
        let unwanted: Vec<String> = (self.live.keys())
            .filter(|id| !door.wants(reg, id))
            .cloned()
            .collect();
        for id in unwanted {
            self.gone(&id);
            self.skipped.insert(id);
        }
        let wanted: Vec<String> = (self.skipped.iter())
            .filter(|id| door.wants(reg, id))
            .cloned()
            .collect();
        for id in wanted {
            self.skipped.remove(&id);
            self.publish(reg, door, id);
        }
    }
}

fn publish<D: PerEditor>(
    reg: &Arc<Registry>,
    door: &D,
    id: &str,
) -> std::io::Result<Entry<D::Door>> {
    let listener = loopback_listener()?;
    door.publish(reg, id, listener, reg.accepting.child_token())
}

fn withdraw<T>(e: &Entry<T>) {
    e.stop.cancel();
    for f in &e.files {
        let _ = std::fs::remove_file(f);
    }
}

/// The folders to publish for `editor`, whose lockfile `lock` the caller has read: as the
/// lockfile wrote them, then resolved (pi-ide compares plain string prefixes; Gemini CLI
/// realpaths).
pub(crate) fn folders(
    editor: &crate::editor::Editor,
    lock: &crate::editor::lockfile::Lockfile,
) -> Vec<String> {
    let mut folders: Vec<String> = lock.workspace_folders.clone();
    for f in &editor.folders {
        let s = f.display().to_string();
        if !folders.contains(&s) {
            folders.push(s);
        }
    }
    folders
}

/// Removes the files in `dir` whose names `matches` accepts and that a broker that died left:
/// ours by marker, the dead broker's pid as `broker_pid` reads it from the file.
pub(crate) fn clean_leftovers(
    dir: &Path,
    matches: fn(&str) -> bool,
    broker_pid: fn(&Value) -> u32,
) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if !entry.file_name().to_str().is_some_and(matches) {
            continue;
        }
        let Some(marked) = read_marked(&path) else {
            continue; // not ours: never touched
        };
        let pid = broker_pid(&marked);
        if pid != std::process::id() && !crate::platform::process::alive(pid) {
            tracing::info!(file = %path.display(), "removing a file left by a broker that died");
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// The JSON of a regular, lockfile-sized file that carries our marker.
pub(crate) fn read_marked(path: &Path) -> Option<Value> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    if !meta.is_file() || meta.len() > crate::editor::lockfile::MAX_LOCKFILE_BYTES {
        return None;
    }
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
    v.get(MARKER).is_some().then_some(v)
}

/// An existing dir a door writes into (or the parent of one it made): a directory of ours
/// that others cannot write to (they could swap the files an agent reads). Never chmodded: it
/// may be another program's (`~/.claude/ide`) or one the user chose.
pub(crate) fn check_private_dir(dir: &Path, meta: &std::fs::Metadata) -> Result<(), String> {
    let me = crate::platform::user::uid();
    if !meta.is_dir() {
        return Err(format!("{} is not a directory; remove it", dir.display()));
    }
    // Windows has no owner or mode bits here: a dir in the profile is the user's.
    let Some((uid, mode)) = crate::platform::user::owner_and_mode(meta) else {
        return Ok(());
    };
    if uid != me {
        return Err(format!(
            "{} belongs to uid {uid}, not to you (uid {me}); remove it or configure another dir",
            dir.display(),
        ));
    }
    let mode = mode & 0o777;
    if mode & 0o022 != 0 {
        return Err(format!(
            "{} is writable by others (mode {mode:04o}); run chmod 700 {}",
            dir.display(),
            dir.display()
        ));
    }
    Ok(())
}

/// The TCP doors' listen backlog: the kernel caps it at `net.core.somaxconn` (4096 on current
/// Linux). A SYN that finds the accept queue full is dropped and retried by the client only
/// after TCP's 1 s retransmission, so the queue is as deep as the kernel allows: a flood must
/// hold thousands of connections there, not a thousand, to delay a new client.
const TCP_BACKLOG: u32 = 4096;
/// How long the kernel keeps a TCP connection that has sent nothing before the broker sees it
/// (it is then accepted and gets `limits::FIRST_BYTE` like any other). Held there it is a few
/// hundred bytes of kernel memory, where accepted it would take an fd and a handshake place;
/// with 1 s a flood's idle connections came back through the accept queue every second.
/// Linux only: `defer_accept` is a no-op elsewhere.
const KERNEL_HOLDS_SILENT: Duration = Duration::from_secs(30);

/// A listener on 127.0.0.1 (a port the kernel picks) for a door open to every local user.
/// On Linux the kernel holds back a connection that has sent nothing (`TCP_DEFER_ACCEPT`, for
/// [`KERNEL_HOLDS_SILENT`]): a flood of idle connections waits in the kernel's handshake
/// queue, costing the broker no fd and no accept, instead of filling the accept queue ahead
/// of a new client; a client that sends its request at once is accepted at once.
pub(crate) fn loopback_listener() -> std::io::Result<TcpListener> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(([127, 0, 0, 1], 0).into())?;
    if let Err(e) = crate::platform::tcp::defer_accept(&socket, KERNEL_HOLDS_SILENT) {
        tracing::debug!(error = %e, "TCP_DEFER_ACCEPT not set");
    }
    socket.listen(TCP_BACKLOG)
}
