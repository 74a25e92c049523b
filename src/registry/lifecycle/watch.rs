//! The lock dir watcher: `notify` events turned into `LockEvent`s for the registry.
//!
//! Watches every configured lock dir with `notify` and turns file-system events into
//! `Upsert` (a valid lockfile), `Rejected` (an invalid one, with why), `Vanished` (removed) and
//! `Cleared` (a file no longer valid) events for the registry. Never deletes a file.
//!
//! Two promises hold on every platform:
//! - **A file has one name**: the dir as configured. FSEvents (macOS) reports canonical paths
//!   (`/private/var/...` for `/var/...`, a symlink's target), inotify the spelling it was given;
//!   each dir's canonical form is kept and event paths are mapped back, so the `known` and
//!   `rejected` tables and every event the registry hears use the configured spelling.
//! - **Only the lock dirs themselves are watched, and never created.** They are the editors'
//!   (`~/.claude/ide` is Claude Code's, and a HOME that never had Claude must not get one): a
//!   missing dir is polled every [`MISSING_DIR_POLL`] until an editor makes it. Its ancestor
//!   is never watched: FSEvents streams are recursive, so watching `$HOME` would wake the
//!   daemon on every change under it.

use super::lockfile;
use crate::editor::lockfile::Lockfile;
use crate::editor::Error;
use crate::sys::config::LockDirConfig;
use crate::sys::fswatch::FsEvents;
use notify::event::{AccessKind, AccessMode, EventKind};
use notify::{RecursiveMode, Watcher as _};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// What the registry hears about lockfiles.
#[derive(Debug)]
pub enum LockEvent {
    /// A valid lockfile appeared, or an existing one changed content.
    Upsert(Lockfile),
    /// A lockfile that was valid is gone (deleted, or no longer valid).
    Vanished(PathBuf),
    /// A file was refused as a lockfile, and why (told once per reason; for `status` and
    /// `doctor`, so nobody needs the log to learn why an editor is not seen).
    Rejected(PathBuf, String),
    /// A refused file is fine now, or gone.
    Cleared(PathBuf),
}

/// Commands to a running watcher.
#[derive(Debug)]
pub enum LockDirCommand {
    /// Replace the set of watched dirs (config reload); answers once the new dirs are scanned.
    SetDirs(Vec<LockDirConfig>, oneshot::Sender<()>),
}

/// The watcher task, for the caller to run on its tracker. `ready` fires once every dir has
/// been listed for the first time; the task ends when `cancel` fires, dropping `events`.
pub(crate) fn watch(
    dirs: Vec<LockDirConfig>,
    events: mpsc::UnboundedSender<LockEvent>,
    commands: mpsc::UnboundedReceiver<LockDirCommand>,
    rescan_interval: Duration,
    ready: oneshot::Sender<()>,
    cancel: CancellationToken,
) -> Result<impl std::future::Future<Output = ()> + Send + 'static, notify::Error> {
    let (watcher, fs_rx) = crate::sys::fswatch::watcher()?;
    let mut w = LockDirWatcher {
        dirs,
        watcher,
        watched: HashMap::new(),
        canonical: HashMap::new(),
        missing: HashSet::new(),
        known: HashMap::new(),
        rejected: HashMap::new(),
        events,
    };
    Ok(async move { w.run(fs_rx, commands, rescan_interval, ready, cancel).await })
}

struct LockDirWatcher {
    /// The dirs we are asked to watch.
    dirs: Vec<LockDirConfig>,
    /// The OS watcher (inotify / FSEvents).
    watcher: notify::RecommendedWatcher,
    /// Dirs currently registered with the OS watcher, as configured, with the identity (device,
    /// inode) of the dir watched: a dir removed and made again is a new dir to watch.
    watched: HashMap<PathBuf, (u64, u64)>,
    /// Each existing dir's canonical path → its configured spelling (event paths are mapped
    /// back through it; refreshed with the watches, so a re-pointed symlink is followed).
    canonical: HashMap<PathBuf, PathBuf>,
    /// Configured dirs that neither exist nor could be created: polled, not watched.
    missing: HashSet<PathBuf>,
    /// Lockfiles reported as valid, so a repeat event reports nothing and a removal is noticed.
    known: HashMap<PathBuf, Lockfile>,
    /// The last rejection reason per file, so a bad file is logged once, not on every event.
    rejected: HashMap<PathBuf, String>,
    /// Where events go.
    events: mpsc::UnboundedSender<LockEvent>,
}

impl LockDirWatcher {
    async fn run(
        &mut self,
        mut fs_rx: FsEvents,
        mut commands: mpsc::UnboundedReceiver<LockDirCommand>,
        rescan_interval: Duration,
        ready: oneshot::Sender<()>,
        cancel: CancellationToken,
    ) {
        self.refresh_watches();
        self.rescan_all();
        let _ = ready.send(());
        let mut rescan = tokio::time::interval(rescan_interval);
        rescan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        rescan.tick().await;
        let mut poll_missing = tokio::time::interval(MISSING_DIR_POLL);
        poll_missing.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = rescan.tick() => {
                    self.refresh_watches();
                    self.rescan_all();
                }
                _ = poll_missing.tick(), if !self.missing.is_empty() => {
                    if self.missing.iter().any(|d| d.is_dir()) {
                        self.refresh_watches();
                        self.rescan_all();
                    }
                }
                Some(cmd) = commands.recv() => match cmd {
                    LockDirCommand::SetDirs(dirs, done) => {
                        self.set_dirs(dirs);
                        let _ = done.send(());
                    }
                },
                Some(res) = fs_rx.recv() => {
                    self.on_fs_event(res);
                    // Drain what is queued already so a burst is handled in one pass.
                    while let Ok(res) = fs_rx.try_recv() {
                        self.on_fs_event(res);
                    }
                }
            }
        }
    }

    fn set_dirs(&mut self, dirs: Vec<LockDirConfig>) {
        for old in self.dirs.clone() {
            if !dirs.contains(&old) {
                tracing::info!(dir = %old.path.display(), "no longer watching lock dir");
                self.forget_dir(&old.path);
            }
        }
        self.dirs = dirs;
        self.refresh_watches();
        self.rescan_all();
    }

    fn on_fs_event(&mut self, res: notify::Result<notify::Event>) {
        let event = match res {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(error = %e, "lock dir watch error; listing every dir again");
                self.refresh_watches();
                self.rescan_all();
                return;
            }
        };
        if matches!(
            event.kind,
            EventKind::Access(AccessKind::Open(_))
                | EventKind::Access(AccessKind::Close(AccessMode::Read))
        ) {
            return;
        }
        if event.need_rescan() {
            self.refresh_watches();
            self.rescan_all();
            return;
        }
        let mut dir_changed = false;
        for path in &event.paths {
            let path = self.as_configured(path);
            if let Some(cfg) = self.dir_of_file(&path) {
                self.check_file(&path, &cfg);
            } else if self.dirs.iter().any(|d| d.path == path) {
                // The dir itself changed (removed, replaced, re-pointed): watch it afresh (a
                // dir made again may reuse the old one's inode number).
                if self.watched.remove(&path).is_some() {
                    let _ = self.watcher.unwatch(&path);
                }
                dir_changed = true;
            }
        }
        if dir_changed {
            self.refresh_watches();
            self.rescan_all();
        }
    }

    fn dir_of_file(&self, path: &Path) -> Option<LockDirConfig> {
        let parent = path.parent()?;
        self.dirs.iter().find(|d| d.path == parent).cloned()
    }

    /// `path` as the configured dirs spell it: a canonical dir, or a file in one, mapped back
    /// to the dir's configured spelling; any other path unchanged.
    fn as_configured(&self, path: &Path) -> PathBuf {
        if let Some(dir) = self.canonical.get(path) {
            return dir.clone();
        }
        match (path.parent(), path.file_name()) {
            (Some(parent), Some(name)) => match self.canonical.get(parent) {
                Some(dir) => dir.join(name),
                None => path.to_path_buf(),
            },
            _ => path.to_path_buf(),
        }
    }

    /// Registers each dir that exists with the OS watcher and records its canonical form; a
    /// missing one is polled (never created: it is the editors').
    fn refresh_watches(&mut self) {
        self.missing.clear();
        self.canonical.clear();
        let mut wanted = HashMap::new();
        for d in &self.dirs {
            let identity = dir_identity(&d.path);
            if identity.is_none() {
                tracing::debug!(dir = %d.path.display(), "lock dir not there (yet); polling for it");
            }
            match identity {
                Some(identity) => {
                    if let Ok(real) = std::fs::canonicalize(&d.path) {
                        self.canonical.insert(real, d.path.clone());
                    }
                    wanted.insert(d.path.clone(), identity);
                }
                None => {
                    self.missing.insert(d.path.clone());
                }
            }
        }
        let stale: Vec<PathBuf> = self
            .watched
            .iter()
            .filter(|(path, identity)| wanted.get(*path) != Some(*identity))
            .map(|(path, _)| path.clone())
            .collect();
        for path in stale {
            let _ = self.watcher.unwatch(&path);
            self.watched.remove(&path);
        }
        for (path, identity) in wanted {
            if self.watched.contains_key(&path) {
                continue;
            }
            match self.watcher.watch(&path, RecursiveMode::NonRecursive) {
                Ok(()) => {
                    tracing::info!(dir = %path.display(), "watching lock dir");
                    warn_if_shared(&path);
                    self.watched.insert(path, identity);
                }
                Err(e) => {
                    tracing::warn!(dir = %path.display(), error = %e, "cannot watch; relying on periodic rescans")
                }
            }
        }
    }

    fn rescan_all(&mut self) {
        for cfg in self.dirs.clone() {
            self.rescan(&cfg);
        }
    }

    /// Lists one dir again: every lockfile in it is checked, and known files not there vanish.
    fn rescan(&mut self, cfg: &LockDirConfig) {
        let mut present = HashSet::new();
        match std::fs::read_dir(&cfg.path) {
            Ok(entries) => {
                for entry in entries.flatten() {
                    let path = entry.path();
                    present.insert(path.clone());
                    self.check_file(&path, cfg);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(dir = %cfg.path.display(), error = %e, "cannot list lock dir"),
        }
        self.forget(|p| p.parent() == Some(cfg.path.as_path()) && !present.contains(p));
    }

    fn forget_dir(&mut self, dir: &Path) {
        self.forget(|p| p.parent() == Some(dir));
    }

    /// Every known lockfile and every refused file that `which` picks is forgotten, each with
    /// its event (`Vanished`, `Cleared`), so the registry's view never keeps a file we dropped.
    fn forget(&mut self, which: impl Fn(&Path) -> bool) {
        let gone: Vec<PathBuf> = self.known.keys().filter(|p| which(p)).cloned().collect();
        for p in gone {
            self.vanish(&p);
        }
        let cleared: Vec<PathBuf> = self.rejected.keys().filter(|p| which(p)).cloned().collect();
        for p in cleared {
            self.clear(&p);
        }
    }

    fn check_file(&mut self, path: &Path, cfg: &LockDirConfig) {
        match lockfile::read(path, cfg.family) {
            Ok(lock) => {
                self.clear(path);
                // Reported on every look, changed or not (the registry's upsert is idempotent):
                // the registry can drop an editor on its own (its link found the file missing
                // in the middle of a rewrite), and a report held back as "unchanged" would
                // leave that editor lost while its file is there.
                self.known.insert(path.to_path_buf(), lock.clone());
                let _ = self.events.send(LockEvent::Upsert(lock));
            }
            Err(Error::NotALockfile) => {}
            Err(Error::Gone) => {
                self.clear(path);
                self.vanish(path);
            }
            Err(e) if e.is_transient() && !stale_partial(path) => {
                tracing::debug!(file = %path.display(), reason = %e, "lockfile not ready yet");
            }
            Err(e) => {
                let reason = if e.is_transient() {
                    "is empty or truncated and has not changed for 2 s".to_string()
                } else {
                    e.to_string()
                };
                if self.rejected.get(path) != Some(&reason) {
                    tracing::warn!(file = %path.display(), reason = %reason, "ignoring lockfile");
                    self.rejected.insert(path.to_path_buf(), reason.clone());
                    let _ = self
                        .events
                        .send(LockEvent::Rejected(path.to_path_buf(), reason));
                }
                self.vanish(path);
            }
        }
    }

    fn clear(&mut self, path: &Path) {
        if self.rejected.remove(path).is_some() {
            let _ = self.events.send(LockEvent::Cleared(path.to_path_buf()));
        }
    }

    fn vanish(&mut self, path: &Path) {
        if self.known.remove(path).is_some() {
            let _ = self.events.send(LockEvent::Vanished(path.to_path_buf()));
        }
    }
}

/// A lock dir others can write to still only yields lockfiles we own (others' are refused),
/// but anyone can fill it with junk: say so once, with the fix.
fn warn_if_shared(dir: &Path) {
    if let Some((_, mode)) = std::fs::metadata(dir)
        .ok()
        .and_then(|m| crate::platform::user::owner_and_mode(&m))
    {
        let mode = mode & 0o777;
        if mode & 0o002 != 0 {
            tracing::warn!(dir = %dir.display(), mode = format!("{mode:04o}"), "lock dir is writable by other users (their lockfiles are refused); run chmod 700 on it");
        }
    }
}

/// An incomplete file untouched for a while is broken, not being written (checked on rescans).
fn stale_partial(path: &Path) -> bool {
    std::fs::symlink_metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age > Duration::from_secs(2))
}

/// How often a lock dir that could not be created is looked for.
pub(crate) const MISSING_DIR_POLL: Duration = Duration::from_secs(1);

/// The (device, inode) of the directory at `dir`, if it is one.
fn dir_identity(dir: &Path) -> Option<(u64, u64)> {
    let m = std::fs::metadata(dir).ok().filter(|m| m.is_dir())?;
    crate::platform::user::file_identity(&m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::family::Family;

    fn watcher(dir: &Path) -> (LockDirWatcher, mpsc::UnboundedReceiver<LockEvent>) {
        let (events, rx) = mpsc::unbounded_channel();
        let w = LockDirWatcher {
            dirs: vec![LockDirConfig {
                path: dir.to_path_buf(),
                family: Family::Pi,
            }],
            // Never pumped: these tests see only what a rescan finds (as on a file system
            // without inotify, or after the kernel's event queue overflowed).
            watcher: notify::recommended_watcher(|_| {}).unwrap(),
            watched: HashMap::new(),
            canonical: HashMap::new(),
            missing: HashSet::new(),
            known: HashMap::new(),
            rejected: HashMap::new(),
            events,
        };
        (w, rx)
    }

    /// A watcher of a lock dir holding one malformed lockfile (the dir, that file), after
    /// the rescan that refused it with its event.
    fn watching_a_refused_file() -> (
        tempfile::TempDir,
        PathBuf,
        LockDirWatcher,
        mpsc::UnboundedReceiver<LockEvent>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("1234.lock");
        std::fs::write(&bad, "not json at all").unwrap();
        let (mut w, mut rx) = watcher(dir.path());
        w.rescan_all();
        assert!(matches!(rx.try_recv(), Ok(LockEvent::Rejected(p, _)) if p == bad));
        (dir, bad, w, rx)
    }

    #[test]
    fn a_refused_file_that_a_rescan_misses_is_cleared_with_its_event() {
        let (_dir, bad, mut w, mut rx) = watching_a_refused_file();
        std::fs::remove_file(&bad).unwrap();
        w.rescan_all();
        assert!(matches!(rx.try_recv(), Ok(LockEvent::Cleared(p)) if p == bad));
        assert!(w.rejected.is_empty());
    }

    #[test]
    fn an_unchanged_lockfile_is_reported_again_on_every_look() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("1234.lock");
        let me = std::process::id();
        std::fs::write(
            &file,
            format!(r#"{{"pid":{me},"workspaceFolders":["/a"],"authToken":"0123456789abcdef"}}"#),
        )
        .unwrap();
        let (mut w, mut rx) = watcher(dir.path());
        w.rescan_all();
        assert!(matches!(rx.try_recv(), Ok(LockEvent::Upsert(l)) if l.path == file));
        // The registry may have dropped the editor meanwhile (its link saw the file missing in
        // the middle of a rewrite): the same file seen again is reported again.
        w.rescan_all();
        assert!(
            matches!(rx.try_recv(), Ok(LockEvent::Upsert(l)) if l.path == file),
            "an unchanged lockfile must be reported again"
        );
    }

    #[cfg(unix)]
    fn lockfile_text() -> String {
        let me = std::process::id();
        format!(r#"{{"pid":{me},"workspaceFolders":["/a"],"authToken":"0123456789abcdef"}}"#)
    }

    /// FSEvents names a file by its canonical path; the watcher must map it back to the dir
    /// as configured (here: through a symlink), or the file is never matched to its dir.
    #[cfg(unix)] // Unix file modes, symlinks or sockets
    #[test]
    fn an_event_spelled_canonically_is_matched_to_the_dir_as_configured() {
        let root = tempfile::tempdir().unwrap();
        let real = root.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let link = root.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let (mut w, mut rx) = watcher(&link);
        w.refresh_watches();
        let canonical_file = std::fs::canonicalize(&real).unwrap().join("77.lock");
        std::fs::write(&canonical_file, lockfile_text()).unwrap();
        let event = notify::Event::new(EventKind::Create(notify::event::CreateKind::File))
            .add_path(canonical_file.clone());
        w.on_fs_event(Ok(event));
        let configured = link.join("77.lock");
        match rx.try_recv() {
            Ok(LockEvent::Upsert(l)) => assert_eq!(l.path, configured),
            other => panic!(
                "expected an upsert of {}, got {other:?}",
                configured.display()
            ),
        }
        assert_eq!(
            w.known.keys().collect::<Vec<_>>(),
            vec![&configured],
            "one name per file: the configured spelling"
        );
        // Its removal, spelled canonically too, is the same file vanishing.
        std::fs::remove_file(&canonical_file).unwrap();
        let event = notify::Event::new(EventKind::Remove(notify::event::RemoveKind::File))
            .add_path(canonical_file);
        w.on_fs_event(Ok(event));
        assert!(matches!(rx.try_recv(), Ok(LockEvent::Vanished(p)) if p == configured));
    }

    /// Another program's lock dir (`~/.claude/ide` in a HOME that never had Claude) is never
    /// created: it is polled, with no ancestor watched, and taken once an editor makes it.
    #[test]
    fn a_missing_lock_dir_is_not_created_but_polled_and_taken_when_it_appears() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("home/.claude/ide");
        let (mut w, _rx) = watcher(&dir);
        w.refresh_watches();
        assert!(!root.path().join("home").exists(), "nothing created");
        assert!(w.watched.is_empty(), "nothing watched: {:?}", w.watched);
        assert_eq!(w.missing, HashSet::from([dir.clone()]));
        // An editor makes it: the next refresh takes the dir itself.
        std::fs::create_dir_all(&dir).unwrap();
        w.refresh_watches();
        assert!(w.missing.is_empty());
        assert_eq!(
            w.watched.keys().collect::<Vec<_>>(),
            vec![&dir],
            "the dir, no ancestor"
        );
    }

    #[test]
    fn a_dropped_dir_forgets_its_refused_files_with_their_events() {
        let (_dir, bad, mut w, mut rx) = watching_a_refused_file();
        w.set_dirs(Vec::new());
        assert!(matches!(rx.try_recv(), Ok(LockEvent::Cleared(p)) if p == bad));
        assert!(rx.try_recv().is_err(), "nothing else");
    }
}
