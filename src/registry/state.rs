//! What survives a broker restart: sticky targets and the identity book, saved atomically.
//!
//! What must survive a broker restart: sticky targets and the editor identity book. One JSON
//! file, written atomically (temp file + fsync + rename + fsync of the dir) by a saver task
//! that coalesces changes.

use crate::platform::sync::lock;
use crate::registry::identity::Book;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// How long changes are gathered before the state file is written.
const SAVE_COALESCE: std::time::Duration = std::time::Duration::from_millis(100);

/// A session key's remembered editor.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Sticky {
    /// The editor id.
    pub editor: String,
    /// Unix seconds when it was set.
    pub since: u64,
}

/// The file's content.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct State {
    /// Format version.
    #[serde(default)]
    pub version: u32,
    /// Sticky targets by session key.
    #[serde(default)]
    pub sticky: BTreeMap<String, Sticky>,
    /// Every editor id known, live or recently lost, with the process holding it.
    #[serde(default)]
    pub editors: Book,
    /// Unix ms of the last save: editors live then and missing at the next start were lost
    /// at about that time.
    #[serde(default)]
    pub saved_at: u64,
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The state file and its in-memory copy.
pub struct StateStore {
    /// `<state_dir>/state.json`.
    path: PathBuf,
    /// The current state.
    state: Mutex<State>,
    /// Wakes the saver after a change.
    dirty: Notify,
    /// How many times the file was written.
    writes: std::sync::atomic::AtomicU64,
}

impl StateStore {
    /// Loads the file; a missing file is empty state, a corrupt one is moved aside (logged)
    /// so nothing is silently overwritten.
    pub fn load(dir: &Path) -> StateStore {
        let path = dir.join("state.json");
        let state = match std::fs::read_to_string(&path) {
            Ok(text) => match serde_json::from_str::<State>(&text) {
                Ok(s) => s,
                Err(e) => {
                    let aside = path.with_extension("json.corrupt");
                    tracing::warn!(file = %path.display(), error = %e, moved_to = %aside.display(), "state file is corrupt; starting with no sticky targets");
                    let _ = std::fs::rename(&path, &aside);
                    State::default()
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => State::default(),
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "cannot read state file; starting with no sticky targets");
                State::default()
            }
        };
        let mut state = state;
        let saved_at = state.saved_at;
        state.editors.loaded(saved_at);
        StateStore {
            path,
            state: Mutex::new(state),
            dirty: Notify::new(),
            writes: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The file path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The sticky editor for a key.
    pub fn sticky(&self, key: &str) -> Option<String> {
        lock(&self.state).sticky.get(key).map(|s| s.editor.clone())
    }

    /// All sticky targets.
    pub fn all_sticky(&self) -> BTreeMap<String, Sticky> {
        lock(&self.state).sticky.clone()
    }

    /// Remembers `editor` for `key`.
    pub fn set_sticky(&self, key: &str, editor: &str) {
        let mut s = lock(&self.state);
        if s.sticky.get(key).map(|t| t.editor.as_str()) == Some(editor) {
            return;
        }
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        s.sticky.insert(
            key.into(),
            Sticky {
                editor: editor.into(),
                since,
            },
        );
        drop(s);
        self.dirty.notify_one();
    }

    /// Forgets the target of `key`.
    pub fn remove_sticky(&self, key: &str) {
        if lock(&self.state).sticky.remove(key).is_some() {
            self.dirty.notify_one();
        }
    }

    /// Runs `f` on the editor identity book and schedules a save.
    pub fn with_book<R>(&self, f: impl FnOnce(&mut Book) -> R) -> R {
        let mut state = lock(&self.state);
        let before = state.editors.clone();
        let r = f(&mut state.editors);
        let changed = state.editors != before;
        drop(state);
        if changed {
            self.dirty.notify_one();
        }
        r
    }

    /// Forgets every target pointing at `editor`.
    pub fn remove_editor(&self, editor: &str) {
        let mut s = lock(&self.state);
        let before = s.sticky.len();
        s.sticky.retain(|_, t| t.editor != editor);
        if s.sticky.len() != before {
            drop(s);
            self.dirty.notify_one();
        }
    }

    /// Writes the current state now.
    pub fn save(&self) -> std::io::Result<()> {
        self.save_at(unix_ms())
    }

    /// Writes the current state now, stamped as saved at `now_ms` (the registry's model test
    /// runs on a clock of its own).
    pub fn save_at(&self, now_ms: u64) -> std::io::Result<()> {
        write_atomic(&self.path, &self.snapshot(now_ms)?)?;
        self.wrote();
        Ok(())
    }

    /// How many times this store wrote its file (each write an fsync or two).
    pub fn writes(&self) -> u64 {
        self.writes.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn wrote(&self) {
        self.writes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The file's bytes for the current state.
    fn snapshot(&self, now_ms: u64) -> std::io::Result<Vec<u8>> {
        let mut snapshot = lock(&self.state).clone();
        snapshot.version = 2;
        snapshot.saved_at = now_ms;
        serde_json::to_vec_pretty(&snapshot).map_err(std::io::Error::other)
    }

    /// Saves after changes until `stop` fires. Changes within 100 ms share one write
    /// (an editor flapping its lockfile must not turn into an fsync per event); a graceful
    /// stop saves once more, so nothing is lost but on a crash within that window.
    pub async fn saver(&self, stop: &CancellationToken) {
        loop {
            // Stops only between writes: a write in progress is finished, never torn by
            // the final save on shutdown.
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = self.dirty.notified() => {}
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(SAVE_COALESCE) => {}
            }
            // fsync off the runtime's thread: sessions never wait for the disk.
            let path = self.path.clone();
            let written = match self.snapshot(unix_ms()) {
                Ok(bytes) => tokio::task::spawn_blocking(move || write_atomic(&path, &bytes))
                    .await
                    .unwrap_or_else(|e| Err(std::io::Error::other(e))),
                Err(e) => Err(e),
            };
            match written {
                Ok(()) => self.wrote(),
                Err(e) => {
                    tracing::warn!(file = %self.path.display(), error = %e, "cannot write state file")
                }
            }
        }
    }
}

/// Writes `bytes` to `path` atomically with mode 0600, creating the dir (0700) if missing, and
/// flushes file and dir to disk before returning: for what must survive a crash (the state).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    replace(path, bytes, true)
}

/// [`write_atomic`] without the flushes, for files that describe the running daemon (a crash
/// leaves them stale whether they reached the disk or not, and the next start removes them).
/// A flush can take milliseconds on a busy disk, and these are written on the runtime's thread.
pub fn write_atomic_unsynced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    replace(path, bytes, false)
}

/// Writes a temporary file beside `path` and renames it into place; `sync` flushes both.
fn replace(path: &Path, bytes: &[u8], sync: bool) -> std::io::Result<()> {
    crate::platform::user::replace_private(path, bytes, sync)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ten changes 10 ms apart (an editor flapping its lockfile) are saved in a write or two,
    /// not ten, and the file ends with the last.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_burst_of_changes_shares_its_writes_and_the_last_one_is_saved() {
        let dir = tempfile::tempdir().unwrap();
        let s = std::sync::Arc::new(StateStore::load(dir.path()));
        let stop = CancellationToken::new();
        let saver = tokio::spawn({
            let (s, stop) = (s.clone(), stop.clone());
            async move { s.saver(&stop).await }
        });
        for i in 0..10 {
            s.set_sticky("k", &format!("editor-{i}"));
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        // The file lands (off the runtime's thread) just before its write is counted.
        crate::testkit::eventually("the last change on disk, its write counted", || {
            let on_disk = StateStore::load(dir.path()).sticky("k");
            (on_disk.as_deref() == Some("editor-9") && s.writes() > 0).then_some(())
        })
        .await;
        let writes = s.writes();
        // 100 ms of changes span one or two 100 ms windows (three on a slow machine).
        assert!((1..=4).contains(&writes), "{writes} writes for 10 changes");
        stop.cancel();
        crate::testkit::within("the saver stops", saver)
            .await
            .unwrap();
    }

    #[test]
    fn round_trips_and_survives_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let s = StateStore::load(dir.path());
        s.set_sticky("k1", "neovim-abc");
        s.set_sticky("k2", "code-def");
        s.save().unwrap();
        let again = StateStore::load(dir.path());
        assert_eq!(again.sticky("k1").as_deref(), Some("neovim-abc"));
        again.remove_editor("code-def");
        assert_eq!(again.sticky("k2"), None);
        std::fs::write(dir.path().join("state.json"), "{nope").unwrap();
        let fresh = StateStore::load(dir.path());
        assert!(fresh.all_sticky().is_empty());
        assert!(dir.path().join("state.json.corrupt").exists());
    }

    #[cfg(unix)] // Unix file modes, symlinks or sockets
    #[test]
    fn atomic_writes_are_private_and_replace_whole() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        for (name, write) in [
            (
                "synced",
                write_atomic as fn(&Path, &[u8]) -> std::io::Result<()>,
            ),
            ("unsynced", write_atomic_unsynced),
        ] {
            let p = dir.path().join(name).join("f.json");
            write(&p, b"{\"long\": \"first version\"}").unwrap();
            write(&p, b"{}").unwrap();
            assert_eq!(std::fs::read(&p).unwrap(), b"{}", "{name}");
            assert_eq!(
                std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
                0o600,
                "{name}"
            );
            let parent = p.parent().unwrap();
            assert_eq!(
                std::fs::metadata(parent).unwrap().permissions().mode() & 0o777,
                0o700,
                "{name}"
            );
            let names: Vec<_> = std::fs::read_dir(parent)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(names, ["f.json"], "{name}: a temporary file was left");
        }
    }
}
