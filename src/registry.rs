//! The live set of editors and sessions, and every decision that changes it: editors
//! appearing, restarting (successors) and vanishing; sessions attaching and detaching.
//! DashMap guards are never held across an `.await`.

use crate::config::Config;
use crate::editor::{self, lock, Delegation, Editor, LinkHost};
use crate::lockdir::LockEvent;
use crate::lockfile::Lockfile;
use crate::router::{self, Decision, EditorView};
use crate::session::{Control, Session};
use crate::state::StateStore;
use dashmap::DashMap;
use serde_json::{json, Map, Value};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant, SystemTime};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// An editor that vanished recently, remembered to recognise its restart.
struct Departed {
    id: String,
    identity: Identity,
    restarts: u32,
    port: u16,
    at: Instant,
}

/// What makes two lockfiles "the same editor": family, ideName and folders.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Identity {
    family: crate::family::Family,
    ide_name: String,
    folders: Vec<String>,
}

impl Identity {
    fn of(l: &Lockfile) -> Self {
        Identity {
            family: l.family,
            ide_name: l.ide_name.clone(),
            folders: l.workspace_folders.clone(),
        }
    }

    /// A readable id that is the same for every incarnation of this editor, across editor
    /// and broker restarts: `<ide name>-<6 hex of a hash of the identity>`.
    fn base_id(&self) -> String {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut feed = |bytes: &[u8]| {
            for b in bytes {
                h ^= u64::from(*b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
            h ^= 0xff;
            h = h.wrapping_mul(0x0100_0000_01b3);
        };
        feed(self.family.as_str().as_bytes());
        feed(self.ide_name.as_bytes());
        for f in &self.folders {
            feed(f.as_bytes());
        }
        let slug: String = self
            .ide_name
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .take(16)
            .collect::<String>()
            .to_ascii_lowercase();
        let slug = if slug.is_empty() {
            "editor".to_string()
        } else {
            slug
        };
        format!("{slug}-{:06x}", h & 0xff_ffff)
    }
}

/// The broker's shared state.
pub struct Registry {
    /// Current config (replaced on reload).
    config: RwLock<Arc<Config>>,
    /// Live editors by id.
    pub editors: DashMap<String, Arc<Editor>>,
    /// Lockfile path → editor id.
    by_path: DashMap<PathBuf, String>,
    /// Live sessions by id.
    pub sessions: DashMap<u64, Arc<Session>>,
    /// Recently vanished editors (successor detection).
    graveyard: Mutex<Vec<Departed>>,
    /// Serialises editor add/remove (lock events and link tasks race otherwise).
    mutate: Mutex<()>,
    /// Sticky targets, persisted.
    pub state: StateStore,
    /// Session id counter.
    next_session: AtomicU64,
    /// The last activity stamp handed out.
    activity: AtomicU64,
    /// Wall-clock start, for status.
    pub started_at: SystemTime,
    /// The native socket path, for status.
    pub socket: PathBuf,
    /// `$HOME`, normalised: a weak folder for routing.
    home: PathBuf,
    /// Cancelled on shutdown.
    pub cancel: CancellationToken,
    /// Every task the broker spawns, waited for on shutdown.
    pub tracker: TaskTracker,
    /// Bumped on every change status would show (editor added/removed/state, attachments):
    /// tests and the service's STATUS line await it instead of polling.
    changes: tokio::sync::watch::Sender<u64>,
    /// The compat door's event queue, when the door is enabled.
    compat: std::sync::OnceLock<
        tokio::sync::mpsc::UnboundedSender<crate::frontdoor::compat::CompatEvent>,
    >,
    /// Ourselves, for handing `Arc<dyn LinkHost>` to link tasks.
    me: Weak<Registry>,
}

impl Registry {
    /// A registry with no editors or sessions yet.
    pub fn new(
        config: Arc<Config>,
        state: StateStore,
        socket: PathBuf,
        cancel: CancellationToken,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| Registry {
            config: RwLock::new(config),
            editors: DashMap::new(),
            by_path: DashMap::new(),
            sessions: DashMap::new(),
            graveyard: Mutex::new(Vec::new()),
            mutate: Mutex::new(()),
            state,
            next_session: AtomicU64::new(1),
            activity: AtomicU64::new(0),
            started_at: SystemTime::now(),
            socket,
            home: router::normalize(&crate::config::home_dir()),
            cancel,
            tracker: TaskTracker::new(),
            changes: tokio::sync::watch::Sender::new(0),
            compat: std::sync::OnceLock::new(),
            me: me.clone(),
        })
    }

    /// The current config.
    pub fn config(&self) -> Arc<Config> {
        self.config
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replaces the config (reload).
    pub fn set_config(&self, c: Arc<Config>) {
        *self.config.write().unwrap_or_else(|p| p.into_inner()) = c;
    }

    /// Connects the compat door (called once at start when it is enabled).
    pub fn set_compat(
        &self,
        tx: tokio::sync::mpsc::UnboundedSender<crate::frontdoor::compat::CompatEvent>,
    ) {
        let _ = self.compat.set(tx);
    }

    fn tell_compat(&self, ev: crate::frontdoor::compat::CompatEvent) {
        if let Some(tx) = self.compat.get() {
            let _ = tx.send(ev);
        }
    }

    /// Records that something status shows has changed.
    pub fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A receiver that wakes on every [`Registry::changed`].
    pub fn subscribe_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// A strictly increasing, non-zero stamp ordering activity and focus (two events in the
    /// same millisecond still have an order).
    pub fn stamp(&self) -> u64 {
        self.activity.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// A fresh session id.
    pub fn next_session_id(&self) -> u64 {
        self.next_session.fetch_add(1, Ordering::Relaxed)
    }

    /// Applies one event from the lock dir watcher.
    pub fn apply(&self, event: LockEvent) {
        match event {
            LockEvent::Upsert(lock) => self.upsert(lock),
            LockEvent::Vanished(path) => {
                let _m = lock(&self.mutate);
                if let Some((_, id)) = self.by_path.remove(&path) {
                    tracing::info!(editor = %id, file = %path.display(), "editor lockfile removed");
                    self.retire(&id);
                }
            }
        }
    }

    fn upsert(&self, lockfile: Lockfile) {
        let _m = lock(&self.mutate);
        if let Some(id) = self.by_path.get(&lockfile.path).map(|r| r.clone()) {
            if let Some(e) = self.editors.get(&id).map(|e| e.clone()) {
                let old = e.lockfile();
                if old.port == lockfile.port
                    && old.pid == lockfile.pid
                    && old.auth_token == lockfile.auth_token
                    && Identity::of(&old) == Identity::of(&lockfile)
                {
                    return;
                }
                if old.port == lockfile.port
                    && old.pid == lockfile.pid
                    && Identity::of(&old) == Identity::of(&lockfile)
                {
                    // Same editor, new token: the link task re-reads it on the next dial.
                    *lock(&e.lock) = lockfile;
                    return;
                }
            }
            self.by_path.remove(&lockfile.path);
            self.retire(&id);
        }
        self.add(lockfile);
    }

    /// Registers a new editor (or the successor of a recently vanished one) and starts its link.
    fn add(&self, lockfile: Lockfile) {
        let identity = Identity::of(&lockfile);
        // The same editor restarted while its old link was still redialling a dead pid: the old
        // one is gone for good now, and the new one is its successor (same id, same sessions).
        let stale = self.editors.iter().find_map(|e| {
            let l = e.lockfile();
            (Identity::of(&l) == identity && !e.usable() && !crate::lockfile::pid_alive(l.pid))
                .then(|| e.id.clone())
        });
        if let Some(old) = stale {
            tracing::info!(editor = %old, "its process is dead and a restart appeared; retiring it");
            self.retire(&old);
        }
        let window = Duration::from_millis(self.config().successor_window_ms);
        let predecessor = {
            let mut g = lock(&self.graveyard);
            g.retain(|d| d.at.elapsed() < window);
            g.iter()
                .position(|d| d.identity == identity && !self.editors.contains_key(&d.id))
                .map(|i| g.remove(i))
        };
        let (id, restarts, previous_port) = match &predecessor {
            Some(d) => (d.id.clone(), d.restarts + 1, Some(d.port)),
            None => {
                let base = identity.base_id();
                let mut id = base.clone();
                let mut n = 2;
                while self.editors.contains_key(&id) {
                    id = format!("{base}-{n}");
                    n += 1;
                }
                (id, 0, None)
            }
        };
        let folders = lockfile
            .workspace_folders
            .iter()
            .map(|f| router::normalize(std::path::Path::new(f)))
            .collect();
        match previous_port {
            Some(p) => {
                tracing::info!(editor = %id, port = lockfile.port, previous_port = p, restarts, ide = %lockfile.ide_name, "editor restarted (successor)")
            }
            None => {
                tracing::info!(editor = %id, port = lockfile.port, pid = lockfile.pid, family = %lockfile.family, ide = %lockfile.ide_name, "editor appeared")
            }
        }
        let path = lockfile.path.clone();
        let editor = Arc::new(Editor::new(
            id.clone(),
            lockfile,
            folders,
            restarts,
            previous_port,
            self.cancel.child_token(),
        ));
        self.editors.insert(id.clone(), editor.clone());
        self.by_path.insert(path, id.clone());
        if let Some(me) = self.me.upgrade() {
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
            if s.editor_id().as_deref() == Some(id.as_str()) {
                let _ = s.control.send(Control::Rebind);
            }
        }
    }

    /// Removes an editor (its lockfile vanished or its pid died) and starts the grace period
    /// after which its sessions are detached and its sticky targets dropped.
    fn retire(&self, id: &str) {
        let Some((_, e)) = self.editors.remove(id) else {
            return;
        };
        self.by_path.retain(|_, v| v != id);
        e.cancel.cancel();
        self.changed();
        let l = e.lockfile();
        lock(&self.graveyard).push(Departed {
            id: id.to_string(),
            identity: Identity::of(&l),
            restarts: e.restarts,
            port: l.port,
            at: Instant::now(),
        });
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
    fn grace_expired(&self, id: &str) {
        if self.editors.contains_key(id) {
            return;
        }
        tracing::info!(editor = %id, "editor gone for good");
        self.state.remove_editor(id);
        self.tell_compat(crate::frontdoor::compat::CompatEvent::Gone(id.to_string()));
        let orphans: Vec<Arc<Session>> = self
            .sessions
            .iter()
            .filter(|s| s.editor_id().as_deref() == Some(id))
            .map(|s| s.clone())
            .collect();
        for s in orphans {
            if s.door == crate::session::Door::Compat {
                // Its virtual lockfile is withdrawn: close it, as the editor itself would.
                s.close();
                continue;
            }
            self.detach(&s, &format!("editor {id} is gone"), false);
            self.place(&s);
        }
    }

    /// Editors as routing sees them.
    fn views(&self) -> Vec<EditorView> {
        self.editors
            .iter()
            .map(|e| EditorView {
                id: e.id.clone(),
                folders: e.folders.clone(),
                last_selection_ms: Some(e.last_selection_ms.load(Ordering::Relaxed))
                    .filter(|v| *v > 0),
                usable: e.usable(),
            })
            .collect()
    }

    /// Routes a session: its sticky target if still a candidate, else the best match.
    pub fn decide(&self, s: &Session) -> Decision {
        let views = self.views();
        let cands = router::candidates(&s.cwd, &views, &self.home);
        let sticky = s.key.as_deref().and_then(|k| self.state.sticky(k));
        if let (Some(k), Some(t)) = (s.key.as_deref(), sticky.as_deref()) {
            // A sticky editor that is up but no longer covers this cwd is forgotten.
            if let Some(v) = views.iter().find(|v| v.id == t) {
                if router::best_folder(&s.cwd, &v.folders, &self.home).is_none() {
                    self.state.remove_sticky(k);
                }
            }
        }
        router::decide(&cands, sticky.as_deref())
    }

    /// First placement of a new session: an explicit editor, else routing.
    pub fn place_new_session(&self, s: &Arc<Session>, explicit: Option<&str>) {
        if let (crate::session::Door::Compat, Some(id)) = (s.door, explicit) {
            // A compat entry stands for one editor: pinned, even while it restarts.
            *lock(&s.editor) = Some(id.to_string());
            s.touch(self.stamp());
            self.changed();
            let _ = s.control.send(Control::Attached(id.to_string()));
            return;
        }
        if let Some(want) = explicit {
            if let Err(e) = self.attach_explicit(s, want) {
                let _ = s.control.send(Control::Detached(e));
            }
            return;
        }
        self.place(s);
    }

    /// Attaches an unattached session if routing finds exactly one editor.
    fn place(&self, s: &Arc<Session>) {
        if s.editor_id().is_some() || s.detached_by_client.load(Ordering::Relaxed) {
            return;
        }
        if let Decision::Editor(id) = self.decide(s) {
            self.attach(s, &id);
        }
    }

    fn attach(&self, s: &Session, id: &str) {
        *lock(&s.editor) = Some(id.to_string());
        s.detached_by_client.store(false, Ordering::Relaxed);
        s.touch(self.stamp());
        if let Some(k) = &s.key {
            self.state.set_sticky(k, id);
        }
        tracing::info!(session = s.id, editor = %id, "session attached");
        self.changed();
        let _ = s.control.send(Control::Attached(id.to_string()));
    }

    /// `broker/attach`: switch to a named editor (which becomes the sticky target).
    pub fn attach_explicit(&self, s: &Session, id: &str) -> Result<(), String> {
        if !self.editors.contains_key(id) {
            return Err(format!(
                "no editor with id {id:?}; call broker/editors for the list"
            ));
        }
        self.attach(s, id);
        Ok(())
    }

    /// Detaches a session; `by_client` keeps it from being auto-attached again.
    pub fn detach(&self, s: &Session, reason: &str, by_client: bool) {
        let was = lock(&s.editor).take();
        s.detached_by_client.store(by_client, Ordering::Relaxed);
        if by_client {
            if let Some(k) = &s.key {
                self.state.remove_sticky(k);
            }
        }
        if was.is_some() {
            tracing::info!(session = s.id, reason, "session detached");
            self.changed();
            let _ = s.control.send(Control::Detached(reason.to_string()));
        }
    }

    /// Why a session has no editor, in words a user can act on.
    pub fn unattached_reason(&self, s: &Session) -> String {
        match self.decide(s) {
            Decision::NoMatch => format!(
                "no editor is open on {} (no workspace folder contains it); open the project in an editor, or call broker/editors and broker/attach",
                s.cwd_raw
            ),
            Decision::Ambiguous(ids) => format!(
                "several editors match {} equally ({}); choose one with broker/attach",
                s.cwd_raw,
                ids.join(", ")
            ),
            Decision::Editor(_) if s.detached_by_client.load(Ordering::Relaxed) => {
                "detached by client; call broker/attach to attach again".into()
            }
            Decision::Editor(id) => format!("editor {id} is not attached yet; retry"),
        }
    }

    /// `broker/editors`: the candidates for a session's cwd, best first.
    pub fn editors_for(&self, s: &Session) -> Value {
        let views = self.views();
        let mut all = views.clone();
        for v in &mut all {
            v.usable = true;
        }
        let cands = router::candidates(&s.cwd, &all, &self.home);
        let editors: Vec<Value> = cands
            .iter()
            .filter_map(|c| {
                let e = self.editors.get(&c.id)?;
                let l = e.lockfile();
                Some(json!({
                    "id": e.id,
                    "ide_name": l.ide_name,
                    "family": e.family,
                    "workspace_folders": l.workspace_folders,
                    "matched_folder": c.matched.folder,
                    "state": e.state(),
                }))
            })
            .collect();
        json!({"attached": s.editor_id(), "editors": editors})
    }

    /// Cleans up after a session: its pending diffs are closed in the editor (only its own),
    /// its other requests forgotten, the editor requests it owed answered with an error.
    pub fn end_session(&self, s: &Session) {
        self.sessions.remove(&s.id);
        self.changed();
        let editors: Vec<Arc<Editor>> = self.editors.iter().map(|e| e.clone()).collect();
        for e in editors {
            let mine: Vec<u64> = e
                .pending
                .iter()
                .filter(|p| matches!(&p.owner, editor::Owner::Session { session, .. } if *session == s.id))
                .map(|p| *p.key())
                .collect();
            for uid in mine {
                let Some((_, p)) = e.pending.remove(&uid) else {
                    continue;
                };
                if let Some(t) = &p.timer {
                    t.abort();
                }
                if let Some(tab) = p.editor_tab() {
                    tracing::info!(session = s.id, editor = %e.id, "closing the diff of a departed session");
                    if let Err(err) = e.close_tab(tab) {
                        tracing::warn!(editor = %e.id, error = %err, "could not close an orphaned diff");
                    }
                }
            }
        }
        let owed: Vec<(String, Value)> = lock(&s.delegated).drain().map(|(_, v)| v).collect();
        for (eid, orig) in owed {
            if let Some(e) = self.editors.get(&eid) {
                e.delegated.remove(&orig.to_string());
                let _ = e.send_raw(crate::jsonrpc::error(
                    &orig,
                    crate::jsonrpc::SERVER_ERROR,
                    "Client disconnected",
                ));
            }
        }
    }

    /// A session's answer to an editor-initiated request: back to that editor with its id.
    pub fn answer_delegated(&self, s: &Session, id: Value, mut msg: Map<String, Value>) {
        let key = match &id {
            Value::String(k) => k.clone(),
            other => other.to_string(),
        };
        let Some((eid, orig)) = lock(&s.delegated).remove(&key) else {
            tracing::info!(session = s.id, %id, "answer to no pending editor request; ignored");
            return;
        };
        let Some(e) = self.editors.get(&eid).map(|e| e.clone()) else {
            return;
        };
        if e.delegated.remove(&orig.to_string()).is_none() {
            return; // cancelled by the editor meanwhile: a late reply is dropped, as editors do
        }
        msg.insert("id".into(), orig);
        let _ = e.send_raw(Value::Object(msg).to_string());
    }
}

impl LinkHost for Registry {
    fn config(&self) -> Arc<Config> {
        Registry::config(self)
    }

    fn stamp(&self) -> u64 {
        Registry::stamp(self)
    }

    fn state_changed(&self) {
        self.changed();
    }

    fn editor_ready(&self, editor: &Arc<Editor>) {
        self.tell_compat(crate::frontdoor::compat::CompatEvent::Ready(
            editor.id.clone(),
        ));
        let waiting: Vec<Arc<Session>> = self
            .sessions
            .iter()
            .filter(|s| s.editor_id().is_none())
            .map(|s| s.clone())
            .collect();
        for s in waiting {
            self.place(&s);
        }
    }

    fn editor_gone(&self, editor: &Arc<Editor>, reason: String) {
        let _m = lock(&self.mutate);
        let same = self
            .editors
            .get(&editor.id)
            .map(|e| Arc::ptr_eq(&e, editor))
            .unwrap_or(false);
        if same {
            tracing::info!(editor = %editor.id, reason = %reason, "editor removed");
            self.retire(&editor.id);
        }
    }

    fn broadcast(&self, editor: &Arc<Editor>, text: &str) {
        for s in self.sessions.iter() {
            if s.editor_id().as_deref() == Some(editor.id.as_str()) {
                s.outbox.deliver(text.to_string());
            }
        }
    }

    fn delegate(
        &self,
        editor: &Arc<Editor>,
        id: &Value,
        mut msg: Map<String, Value>,
    ) -> Option<Delegation> {
        let target = self
            .sessions
            .iter()
            .filter(|s| s.editor_id().as_deref() == Some(editor.id.as_str()))
            .max_by_key(|s| s.last_active_ms.load(Ordering::Relaxed))
            .map(|s| s.clone())?;
        let facing = target.mint_delegated_id();
        lock(&target.delegated).insert(facing.clone(), (editor.id.clone(), id.clone()));
        msg.insert("id".into(), Value::String(facing.clone()));
        if !target.outbox.deliver(Value::Object(msg).to_string()) {
            lock(&target.delegated).remove(&facing);
            return None;
        }
        Some(Delegation {
            session: target.id,
            session_id: facing,
        })
    }

    fn cancel_delegated(&self, _editor: &Arc<Editor>, d: &Delegation) {
        if let Some(s) = self.sessions.get(&d.session) {
            lock(&s.delegated).remove(&d.session_id);
            s.outbox.deliver(crate::jsonrpc::notification(
                "request_cancelled",
                json!({"id": d.session_id}),
            ));
        }
    }
}
