//! An editor's lifecycle: its lockfile seen, validated, admitted, dialled, ready, routable.
//!
//! Read top to bottom:
//!
//! 1. **seen**: `watch` turns the lock dirs' `notify` events (and a rescan) into `LockEvent`s;
//! 2. **validated**: `lockfile::read` proves a file the user's editor's, or says why not;
//! 3. **admitted**: [`Registry::apply_batch`] gives each new editor its id (`identity`), makes
//!    a successor inherit its predecessor's id and sessions, and starts its link;
//! 4. **dialled**: the link task (`editor::link`, one per editor) dials and redials it;
//! 5. **ready**: the link tells its host (`link_host`), where waiting sessions are placed;
//! 6. **routable**: from then on `router` may choose it; gone, it keeps its id for a grace
//!    period, then is retired.
//!
//! Only step 4 runs outside this folder: the link is the editor layer's.

mod link_host;
pub mod lockfile;
pub(crate) mod watch;

use crate::editor::lockfile::Lockfile;
use crate::editor::{self, Editor, LinkHost};
use crate::platform::sync::lock;
use crate::registry::identity::{Arrival, Assigned, Lineage, Process, Verdict};
use crate::registry::router;
use crate::registry::session::Control;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use watch::{LockDirCommand, LockEvent};

use crate::registry::{EditorEvent, Registry, MAX_LOST_EDITORS};

/// The lineage of a lockfile's editor: what a restart of it keeps.
fn lineage_of(l: &Lockfile) -> Lineage {
    Lineage {
        family: l.family,
        ide_name: l.ide_name.clone(),
        folders: l.workspace_folders.clone(),
    }
}

impl Registry {
    /// Starts the lock dir watcher (the config's dirs) and admits what it reports: the first
    /// listing of every dir before this returns, then each batch as it comes, until the
    /// watcher ends (on `cancel`). The sender takes the watcher's commands (new dirs on a
    /// reload).
    pub async fn watch_lock_dirs(
        self: &Arc<Self>,
    ) -> Result<mpsc::UnboundedSender<LockDirCommand>, notify::Error> {
        let config = self.config();
        let (ev_tx, mut ev_rx) = mpsc::unbounded_channel();
        let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
        let (scanned_tx, scanned_rx) = oneshot::channel();
        self.tracker.spawn(watch::watch(
            config.lock_dirs(),
            ev_tx,
            cmd_rx,
            Duration::from_millis(config.rescan_interval_ms.max(100)),
            scanned_tx,
            self.cancel.clone(),
        )?);
        let _ = scanned_rx.await;
        let mut first = Vec::new();
        while let Ok(ev) = ev_rx.try_recv() {
            first.push(ev);
        }
        self.apply_batch(first);
        let reg = self.clone();
        // Ends when the watcher does (it drops the sender).
        self.tracker.spawn(async move {
            while let Some(ev) = ev_rx.recv().await {
                let mut batch = vec![ev];
                while let Ok(more) = ev_rx.try_recv() {
                    batch.push(more);
                }
                reg.apply_batch(batch);
            }
        });
        Ok(cmd_tx)
    }

    /// Applies one event from the lock dir watcher.
    pub fn apply(&self, event: LockEvent) {
        self.apply_batch(vec![event]);
    }

    /// Applies events read together (the first scan of the lock dirs, or whatever arrived at
    /// once): new editors of one batch get their ids in one decision, so no id depends on
    /// the order in which lockfiles were listed.
    pub fn apply_batch(&self, events: Vec<LockEvent>) {
        let _m = lock(&self.mutate);
        let mut fresh: Vec<Lockfile> = Vec::new();
        for event in events {
            match event {
                LockEvent::Upsert(lockfile) => {
                    fresh.retain(|l| l.path != lockfile.path);
                    // Valid now: no longer refused (also when the refusal was the link's,
                    // which the watcher never heard of).
                    if lock(&self.rejected).remove(&lockfile.path).is_some() {
                        self.changed();
                    }
                    if let Some(new) = self.upsert(lockfile) {
                        fresh.push(new);
                    }
                }
                LockEvent::Rejected(path, reason) => {
                    lock(&self.rejected)
                        .insert(path, (reason, crate::registry::state::unix_ms() / 1000));
                    self.changed();
                }
                LockEvent::Cleared(path) => {
                    if lock(&self.rejected).remove(&path).is_some() {
                        self.changed();
                    }
                }
                LockEvent::Vanished(path) => {
                    fresh.retain(|l| l.path != path);
                    // A file the link refused (`lockfile_refused`) and that is gone now: the
                    // watcher, which knew it as valid, says only that it vanished. (A file
                    // the watcher itself refused is still there: it told Rejected first.)
                    if std::fs::symlink_metadata(&path).is_err()
                        && lock(&self.rejected).remove(&path).is_some()
                    {
                        self.changed();
                    }
                    if let Some((_, id)) = self.by_path.remove(&path) {
                        tracing::info!(editor = %id, file = %path.display(), "editor lockfile removed");
                        self.retire(&id);
                    }
                }
            }
        }
        if !fresh.is_empty() {
            self.admit(fresh);
        }
    }

    /// A lockfile for a known path: the same editor (nothing to do, or a new token), or a new
    /// editor on that path (the old one is retired; the new one is returned for admission).
    pub(super) fn upsert(&self, lockfile: Lockfile) -> Option<Lockfile> {
        if let Some(id) = self.by_path.get(&lockfile.path).map(|r| r.clone()) {
            if let Some(e) = self.editors.get(&id).map(|e| e.clone()) {
                let old = e.lockfile();
                if old.port == lockfile.port
                    && old.pid == lockfile.pid
                    && lineage_of(&old) == lineage_of(&lockfile)
                {
                    if old.auth_token != lockfile.auth_token {
                        // Same editor, new token: the link task re-reads it on the next dial.
                        e.set_lockfile(lockfile);
                    }
                    return None;
                }
            }
            self.by_path.remove(&lockfile.path);
            self.retire(&id);
        }
        Some(lockfile)
    }

    /// Gives new editors their ids (same process, successor, or new: see `identity`) and
    /// starts their links.
    pub(super) fn admit(&self, lockfiles: Vec<Lockfile>) {
        let now = self.facts.now_ms();
        let arrivals: Vec<Arrival> = lockfiles
            .iter()
            .map(|l| Arrival {
                lineage: lineage_of(l),
                process: Process {
                    pid: l.pid,
                    start: self.facts.start_token(l.pid),
                    port: l.port,
                },
            })
            .collect();
        let window = self.config().successor_window_ms;
        let alive = |p: &Process| self.facts.alive(p);
        let (resolution, pruned) = self.state.with_book(|book| {
            let r = book.resolve(&arrivals, &alive, now);
            let pruned = book.prune(now, window, MAX_LOST_EDITORS);
            (r, pruned)
        });
        for id in &resolution.died {
            tracing::info!(editor = %id, "its process is dead and a restart appeared; retiring it");
            self.retire(id);
        }
        for id in resolution.dropped.iter().chain(&pruned) {
            self.forget_editor(id, resolution.dropped.contains(id));
        }
        for (lockfile, assigned) in lockfiles.into_iter().zip(resolution.assigned) {
            self.start_editor(lockfile, assigned);
        }
    }

    /// A lost editor id that will never come back (ambiguous succession, or too old): its
    /// sticky targets are dropped and any session still waiting on it is routed again.
    pub(super) fn forget_editor(&self, id: &str, ambiguous: bool) {
        if ambiguous {
            tracing::warn!(editor = %id, "editor is gone and several editors could succeed it; its sticky targets are dropped (sessions will be asked)");
        } else {
            tracing::debug!(editor = %id, "forgetting a long-gone editor");
        }
        self.state.remove_editor(id);
        for s in self.sessions_on(id) {
            self.detach(&s, &format!("editor {id} is gone"), false);
            self.place(&s);
        }
    }

    /// Creates the handle of an admitted editor and starts its link.
    pub(super) fn start_editor(&self, lockfile: Lockfile, assigned: Assigned) {
        let id = assigned.id;
        // The same process announced again (e.g. its server restarted on another port): the
        // old handle is replaced, the id stays.
        if let Some((_, old)) = self.editors.remove(&id) {
            self.by_path.retain(|_, v| *v != id);
            old.stop();
        }
        match assigned.verdict {
            Verdict::Successor {
                previous_pid,
                previous_port,
            } => {
                tracing::info!(editor = %id, port = lockfile.port, pid = lockfile.pid, previous_pid, previous_port, restarts = assigned.restarts, ide = %lockfile.ide_name, "editor restarted (successor)")
            }
            Verdict::Same => {
                tracing::info!(editor = %id, port = lockfile.port, pid = lockfile.pid, family = %lockfile.family, ide = %lockfile.ide_name, "editor appeared (known process)")
            }
            Verdict::New => {
                tracing::info!(editor = %id, port = lockfile.port, pid = lockfile.pid, family = %lockfile.family, ide = %lockfile.ide_name, "editor appeared")
            }
        }
        let folders = lockfile
            .workspace_folders
            .iter()
            .map(|f| router::normalize(std::path::Path::new(f)))
            .collect();
        let path = lockfile.path.clone();
        let editor = Arc::new(Editor::new(
            id.clone(),
            lockfile,
            folders,
            editor::Succession {
                restarts: assigned.restarts,
                previous_port: assigned.previous_port,
                previous_pid: assigned.previous_pid,
            },
            self.cancel.child_token(),
            self.diffs.clone(),
        ));
        self.editors.insert(id.clone(), editor.clone());
        self.by_path.insert(path, id.clone());
        if let Some(me) = self.me.upgrade().filter(|_| self.spawn_links) {
            let host: Arc<dyn LinkHost> = me;
            let span = editor::span(&editor);
            self.tracker.spawn(tracing::Instrument::instrument(
                editor::run(editor, host),
                span,
            ));
        }
        self.changed();
        // Sessions still attached to this id (a restart) follow it without reconnecting.
        for s in self.sessions.iter() {
            if s.is_on(&id) {
                let _ = s.control.send(Control::Rebind);
            }
        }
    }

    /// Removes an editor (its lockfile vanished or its pid died) and starts the grace period
    /// after which its sessions are detached and its sticky targets dropped.
    pub(super) fn retire(&self, id: &str) {
        let Some((_, e)) = self.editors.remove(id) else {
            return;
        };
        self.by_path.retain(|_, v| v != id);
        e.stop();
        self.changed();
        // A dead editor's diffs went with it.
        self.diffs.forget_dead(crate::platform::process::alive);
        // Only this handle's process is lost: when it died and a restart already inherited
        // the id (`admit` retires the dead one after the book named its successor), the
        // record is the successor's and stays live.
        let lf = e.lockfile();
        let holder = Process {
            pid: lf.pid,
            start: None,
            port: lf.port,
        };
        let now = self.facts.now_ms();
        self.state.with_book(|b| b.lost(id, &holder, now));
        let grace = Duration::from_millis(self.config().editor_grace_ms);
        let me = self.me.clone();
        let id = id.to_string();
        let cancel = self.cancel.clone();
        self.tracker.spawn(async move {
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = tokio::time::sleep(grace) => {
                    if let Some(reg) = me.upgrade() {
                        reg.grace_expired(&id);
                    }
                }
            }
        });
    }

    /// The editor did not come back: detach its sessions (and route them elsewhere if
    /// possible) and forget sticky targets pointing at it.
    pub(super) fn grace_expired(&self, id: &str) {
        if self.editors.contains_key(id) {
            return;
        }
        // Its sticky targets stay: a successor (even days later, after broker restarts)
        // inherits the id and with it every session key that chose it.
        tracing::info!(editor = %id, "editor gone; its sessions are routed again");
        self.publish(EditorEvent::Gone(id.to_string()));
        for s in self.sessions_on(id) {
            if s.pinned {
                // Its virtual lockfile is withdrawn: close it, as the editor itself would.
                s.close();
                continue;
            }
            self.detach(&s, &format!("editor {id} is gone"), false);
            self.place(&s);
        }
    }
}
