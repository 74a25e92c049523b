//! The registry as a link's host: what an editor's link task tells the broker.
//!
//! What an editor's link task tells the broker (ready, gone, notifications, editor-initiated
//! requests) and where it runs.

use super::lockfile;
use super::watch::LockEvent;
use crate::editor::lockfile::Lockfile;
use crate::editor::{Delegation, Editor, Error, LinkHost};
use crate::platform::sync::lock;
use crate::registry::session::Session;
use crate::sys::config::Config;
use serde_json::{json, Map, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio_util::task::TaskTracker;

use crate::registry::{EditorEvent, Registry};

impl Registry {
    /// `editor` is the live handle of its id (not one replaced meanwhile).
    fn is_current(&self, editor: &Arc<Editor>) -> bool {
        self.editors
            .get(&editor.id)
            .is_some_and(|e| Arc::ptr_eq(&e, editor))
    }
}

impl LinkHost for Registry {
    fn config(&self) -> Arc<Config> {
        Registry::config(self)
    }

    fn read_lockfile(&self, editor: &Editor) -> Result<Lockfile, Error> {
        lockfile::read(&editor.lockfile().path, editor.family)
    }

    fn tracker(&self) -> &TaskTracker {
        &self.tracker
    }

    fn stamp(&self) -> u64 {
        Registry::stamp(self)
    }

    fn state_changed(&self) {
        self.changed();
    }

    fn editor_ready(&self, editor: &Arc<Editor>) {
        self.editor_routable(editor);
        // After the sessions: their tasks are woken first, so a waiting agent hears it is
        // attached before the compat door publishes its entry for the editor.
        self.publish(EditorEvent::Ready(editor.id.clone()));
    }

    fn editor_routable(&self, _editor: &Arc<Editor>) {
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
        {
            let _m = lock(&self.mutate);
            if !self.is_current(editor) {
                return;
            }
            tracing::info!(editor = %editor.id, reason = %reason, "editor removed");
            self.retire(&editor.id);
        }
        // A lockfile rewritten by its editor (removed, then written again) can be missing
        // when the link looks and back by the time the watcher's event for it was applied,
        // to the editor just retired: with no event left to come, it is read once more here.
        if let Ok(back) = lockfile::read(&editor.lockfile().path, editor.family) {
            self.apply(LockEvent::Upsert(back));
        }
    }

    fn lockfile_refused(&self, editor: &Arc<Editor>, reason: String) {
        {
            let _m = lock(&self.mutate);
            if !self.is_current(editor) {
                return;
            }
            tracing::warn!(editor = %editor.id, reason = %reason, "editor removed: its lockfile is refused");
            self.retire(&editor.id);
        }
        // Not read again (it would be refused, or pass by a race the dial just lost): listed
        // as refused until the watcher's next look at the file.
        self.apply(LockEvent::Rejected(editor.lockfile().path, reason));
    }

    fn broadcast(&self, editor: &Arc<Editor>, text: &str) {
        for s in self.sessions.iter() {
            if s.is_on(&editor.id) {
                s.notify(s.to_agent(text));
            }
        }
    }

    fn delegate(&self, editor: &Arc<Editor>, id: &Value, mut msg: Map<String, Value>) -> bool {
        let target = self
            .sessions
            .iter()
            .filter(|s| s.is_on(&editor.id))
            // Some doors' agents cannot answer editor-initiated requests (`getSuggestions`).
            .filter(|s| s.door.answers_editor_requests())
            // Nor can a session whose handshake is not done yet.
            .filter(|s| s.greeted.load(Ordering::Acquire))
            .max_by_key(|s| s.last_active.load(Ordering::Relaxed))
            .map(|s| s.clone());
        let Some(target) = target else {
            return false;
        };
        if let (Some(m), Some(params)) = (target.map(), msg.get_mut("params")) {
            m.map_json(params, false);
        }
        let facing = target.mint_delegated_id();
        // Both sides know the request before the session can see it: its answer can come
        // back on another worker thread before `deliver` returns.
        lock(&target.delegated).insert(facing.clone(), (editor.id.clone(), id.clone()));
        editor.track_delegated(
            id,
            Delegation {
                session: target.id,
                session_id: facing.clone(),
            },
        );
        msg.insert("id".into(), Value::String(facing.clone()));
        if !target.outbox.deliver(Value::Object(msg).to_string()) {
            lock(&target.delegated).remove(&facing);
            editor.forget_delegated(id);
            return false;
        }
        true
    }

    fn cancel_delegated(&self, _editor: &Arc<Editor>, d: &Delegation) {
        if let Some(s) = self.sessions.get(&d.session) {
            lock(&s.delegated).remove(&d.session_id);
            s.outbox.deliver(crate::protocol::jsonrpc::notification(
                "request_cancelled",
                json!({"id": d.session_id}),
            ));
        }
    }
}
