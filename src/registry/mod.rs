//! The live editors and sessions, and every decision that changes them.
//!
//! An editor's lifecycle from its lockfile to routable (`lifecycle`, ids from `identity`);
//! sessions placed, attached and detached (`router`); what survives a restart (`state`). DashMap guards are never held across an
//! `.await`. The session as the registry holds it (`session`) and the connection caps
//! (`limits`) sit lower than the rest of it: the doors and the session task use them.
//! Uses `editor` and everything below it.

pub(crate) mod explain;
mod identity;
pub mod lifecycle;
pub(crate) mod limits;
pub(crate) mod router;
pub mod session;
pub mod state;

use crate::editor::Editor;
use crate::platform::sync::lock;
use crate::registry::session::{Control, Session};
use crate::registry::state::StateStore;
use crate::sys::config::Config;
use dashmap::DashMap;
use identity::ProcessFacts;
use router::{Decision, EditorView};
use serde_json::{Map, Value};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::SystemTime;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// What the registry tells its listeners (the compat door) about editors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EditorEvent {
    /// This editor's link is ready (again, after a restart: the same id).
    Ready(String),
    /// This editor is gone for good (its grace period ended).
    Gone(String),
}

/// Why the registry refused a session's choice: this layer's one error type.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// `broker/attach` named an editor that is not live.
    #[error("no editor with id {0:?}; call broker/editors for the list")]
    NoSuchEditor(String),
    /// An agent's session named an editor outside its folder (its realm).
    #[error("editor {editor:?} has no workspace folder containing {cwd}: an agent's session attaches only to an editor of its own folder (broker/editors lists them)")]
    OutOfRealm {
        /// The editor named.
        editor: String,
        /// The session's cwd.
        cwd: String,
    },
    /// A session pinned to its door's editor (compat, Gemini) named another.
    #[error("this session came in through the door of editor {pinned:?} and stays on it; it cannot attach to {editor:?} (connect through that editor's own door, or the broker socket, instead)")]
    Pinned {
        /// The editor named.
        editor: String,
        /// The editor it is pinned to.
        pinned: String,
    },
}

/// The most lost editor records kept for successor detection.
const MAX_LOST_EDITORS: usize = 256;

/// The broker's shared state.
pub struct Registry {
    /// Current config (replaced on reload).
    config: RwLock<Arc<Config>>,
    /// Live editors by id (private: reached through `editor`, `editors`).
    editors: DashMap<String, Arc<Editor>, rustc_hash::FxBuildHasher>,
    /// Lockfile path → editor id.
    by_path: DashMap<PathBuf, String>,
    /// Files refused as lockfiles: path → (reason, unix seconds since).
    rejected: Mutex<std::collections::BTreeMap<PathBuf, (String, u64)>>,
    /// Live sessions by id (private: reached through `add_session`, `sessions`).
    sessions: DashMap<u64, Arc<Session>>,
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
    /// Cancelled on shutdown: every task of the broker stops.
    pub cancel: CancellationToken,
    /// Cancelled first on shutdown (a child of `cancel`): every door stops accepting, so no
    /// session arrives while the others are told the broker is going.
    pub accepting: CancellationToken,
    /// Every task the broker spawns, waited for on shutdown.
    pub tracker: TaskTracker,
    /// Bumped on every change status would show (editor added/removed/state, attachments):
    /// tests and the service's STATUS line await it instead of polling.
    changes: tokio::sync::watch::Sender<u64>,
    /// Who listens to editors becoming ready or going for good (the compat door).
    listeners: Mutex<Vec<tokio::sync::mpsc::UnboundedSender<EditorEvent>>>,
    /// Ourselves, for handing `Arc<dyn LinkHost>` to link tasks.
    me: Weak<Registry>,
    /// Caps on connections in the handshake and on live sessions, for every door.
    pub limits: crate::registry::limits::Limits,
    /// The memory long messages in flight share across every connection
    /// (`max_frames_in_flight_bytes`, `wire::budget`). Read at start.
    pub frames: Arc<crate::wire::budget::FrameBudget>,
    /// Where process liveness, start times and the loss clock come from.
    facts: Arc<dyn ProcessFacts>,
    /// False only in the registry's model test, which plays the links' part itself.
    spawn_links: bool,
    /// The diffs open in editors, journalled beside the state file (`editor::journal`).
    pub diffs: Arc<crate::editor::DiffJournal>,
}

impl Registry {
    /// A registry with no editors or sessions yet.
    pub fn new(
        config: Arc<Config>,
        state: StateStore,
        socket: PathBuf,
        cancel: CancellationToken,
    ) -> Arc<Self> {
        Self::with_facts(config, state, socket, cancel, Arc::new(identity::Os), true)
    }

    /// A registry reading process facts from `facts`; with `spawn_links` false no editor link
    /// is started (the model test says when a link is up).
    pub(crate) fn with_facts(
        config: Arc<Config>,
        state: StateStore,
        socket: PathBuf,
        cancel: CancellationToken,
        facts: Arc<dyn ProcessFacts>,
        spawn_links: bool,
    ) -> Arc<Self> {
        let limits =
            crate::registry::limits::Limits::new(config.max_handshakes, config.max_sessions);
        let home = config
            .home
            .clone()
            .unwrap_or_else(crate::sys::config::home_dir);
        let frames = crate::wire::budget::FrameBudget::new(config.frames_in_flight_bytes());
        let diffs = Arc::new(match state.path().parent() {
            Some(dir) => crate::editor::DiffJournal::open(dir, crate::platform::process::alive),
            None => crate::editor::DiffJournal::in_memory(),
        });
        Arc::new_cyclic(|me| Registry {
            diffs,
            limits,
            frames,
            config: RwLock::new(config),
            editors: DashMap::default(),
            by_path: DashMap::new(),
            rejected: Mutex::new(std::collections::BTreeMap::new()),
            sessions: DashMap::new(),
            mutate: Mutex::new(()),
            state,
            next_session: AtomicU64::new(1),
            activity: AtomicU64::new(0),
            started_at: SystemTime::now(),
            socket,
            home: router::normalize(&home),
            accepting: cancel.child_token(),
            cancel,
            tracker: TaskTracker::new(),
            changes: tokio::sync::watch::Sender::new(0),
            listeners: Mutex::new(Vec::new()),
            me: me.clone(),
            facts,
            spawn_links,
        })
    }

    /// The live editor `id`.
    pub fn editor(&self, id: &str) -> Option<Arc<Editor>> {
        self.editors.get(id).map(|e| e.clone())
    }

    /// Every live editor (a snapshot: no map guard escapes).
    pub fn editors(&self) -> Vec<Arc<Editor>> {
        self.editors.iter().map(|e| e.clone()).collect()
    }

    /// Every live session (a snapshot).
    pub fn sessions(&self) -> Vec<Arc<Session>> {
        self.sessions.iter().map(|s| s.clone()).collect()
    }

    /// The live sessions attached to editor `id` (a snapshot).
    fn sessions_on(&self, id: &str) -> Vec<Arc<Session>> {
        self.sessions
            .iter()
            .filter(|s| s.is_on(id))
            .map(|s| s.clone())
            .collect()
    }

    /// Calls that still wait for an answer: editors' pending calls and diffs that followers
    /// review. A daemon that means to stop cleanly waits until this is 0.
    pub fn calls_pending(&self) -> usize {
        let editors: usize = self.editors().iter().map(|e| e.pending_calls()).sum();
        let reviews: usize = self
            .sessions()
            .iter()
            .flat_map(|s| lock(&s.followers).clone())
            .map(|f| lock(&f.reviews).len())
            .sum();
        editors + reviews
    }

    /// Files refused as lockfiles, with why and since when (unix seconds).
    pub fn rejected_lockfiles(&self) -> Vec<(PathBuf, String, u64)> {
        lock(&self.rejected)
            .iter()
            .map(|(p, (r, t))| (p.clone(), r.clone(), *t))
            .collect()
    }

    /// Registers a connected session (before it is placed).
    pub fn add_session(&self, s: Arc<Session>) {
        self.sessions.insert(s.id, s);
        self.changed();
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

    /// A stream of editors becoming ready and going for good. A new listener is told first
    /// of every editor ready now, so it never misses one that came up before it listened.
    pub fn subscribe_editors(&self) -> tokio::sync::mpsc::UnboundedReceiver<EditorEvent> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut listeners = lock(&self.listeners);
        for e in self.editors.iter().filter(|e| e.usable()) {
            let _ = tx.send(EditorEvent::Ready(e.id.clone()));
        }
        listeners.push(tx);
        rx
    }

    fn publish(&self, ev: EditorEvent) {
        lock(&self.listeners).retain(|tx| tx.send(ev.clone()).is_ok());
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

    /// Editors as routing sees them.
    fn views(&self) -> Vec<EditorView> {
        self.editors
            .iter()
            .map(|e| EditorView {
                id: e.id.clone(),
                folders: e.folders.clone(),
                focus: e.focus_stamp(),
                usable: e.routable(),
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

    /// pi's `/new` and `/fork`: the new session key starts with the sticky target of the key
    /// it replaces (unless it has one of its own, e.g. a resumed session).
    pub fn inherit_sticky(&self, key: &str, from: &str) {
        if key == from || self.state.sticky(key).is_some() {
            return;
        }
        if let Some(editor) = self.state.sticky(from) {
            tracing::info!(key, from, editor = %editor, "session key inherits a sticky target");
            self.state.set_sticky(key, &editor);
        }
    }

    /// First placement of a new session: an explicit editor, else routing.
    pub fn place_new_session(&self, s: &Arc<Session>, explicit: Option<&str>) {
        if let (true, Some(id)) = (s.pinned, explicit) {
            // A compat entry stands for one editor: pinned, even while it restarts.
            *lock(&s.editor) = Some(Arc::from(id));
            s.touch(self.stamp());
            self.changed();
            let _ = s.control.send(Control::Attached(id.to_string()));
            return;
        }
        if let Some(want) = explicit {
            if let Err(e) = self.attach_explicit(s, want) {
                let _ = s.control.send(Control::Detached(e.to_string()));
            }
            return;
        }
        self.place(s);
    }

    /// Attaches an unattached session if routing finds exactly one editor.
    fn place(&self, s: &Arc<Session>) {
        // A pinned session is its door's editor's or nobody's: never routed elsewhere.
        if s.pinned || s.editor_id().is_some() || s.detached_by_client.load(Ordering::Relaxed) {
            return;
        }
        if let Decision::Editor(id) = self.decide(s) {
            self.attach(s, &id);
        }
    }

    fn attach(&self, s: &Session, id: &str) {
        *lock(&s.editor) = Some(Arc::from(id));
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
    /// An agent's session (`Session::realm`) may choose only among the editors whose folders
    /// hold its cwd (those `broker/editors` lists): its rights reach no other editor.
    /// A pinned session (a compat or Gemini door's: the door stands for one editor) may name
    /// only that editor.
    pub fn attach_explicit(&self, s: &Session, id: &str) -> Result<(), Error> {
        if s.pinned {
            let pinned = s.pinned_to.as_deref().unwrap_or_default();
            if pinned != id {
                return Err(Error::Pinned {
                    editor: id.to_string(),
                    pinned: pinned.to_string(),
                });
            }
        }
        if !self.editors.contains_key(id) {
            return Err(Error::NoSuchEditor(id.to_string()));
        }
        if s.realm.is_some() && !self.holds(id, &s.cwd) {
            return Err(Error::OutOfRealm {
                editor: id.to_string(),
                cwd: s.cwd_raw.clone(),
            });
        }
        self.attach(s, id);
        Ok(())
    }

    /// True when editor `id` has a workspace folder containing `cwd` (a weak match counts,
    /// as routing counts it).
    fn holds(&self, id: &str, cwd: &std::path::Path) -> bool {
        self.views()
            .iter()
            .find(|v| v.id == id)
            .is_some_and(|v| router::best_folder(cwd, &v.folders, &self.home).is_some())
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

    /// Cleans up after a session: its pending diffs are closed in the editor (only its own),
    /// its other requests forgotten, the editor requests it owed answered with an error.
    pub fn end_session(&self, s: &Session) {
        self.sessions.remove(&s.id);
        s.gone.cancel();
        self.changed();
        let editors: Vec<Arc<Editor>> = self.editors.iter().map(|e| e.clone()).collect();
        for e in editors {
            for p in e.take_calls_of(s.id) {
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
                e.forget_delegated(&orig);
                let _ = e.send_raw(crate::protocol::jsonrpc::error(
                    &orig,
                    crate::protocol::jsonrpc::SERVER_ERROR,
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
        if !e.forget_delegated(&orig) {
            return; // cancelled by the editor meanwhile: a late reply is dropped, as editors do
        }
        msg.insert("id".into(), orig);
        let _ = e.send_raw(Value::Object(msg).to_string());
    }
}

#[cfg(test)]
mod tests;
