//! A live session as the registry and the doors see it (`Session`, `Intro`, `Door`, `Control`).
//!
//! Who it is, what it is attached to, what it owes. The task that runs it is in `session`.

use crate::platform::sync::lock;
use crate::protocol::family::Family;
use crate::wire::outbox::Outbox;
use serde::Serialize;
use serde_json::Value;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;
use tokio::sync::mpsc;

/// Which front door a session came through. The core's own doors are named here; a door
/// plugged in (`frontdoor::plugin`) names itself, so the core names no family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Door {
    /// The broker's Unix socket (`/v1/session`).
    Native,
    /// A virtual lockfile's loopback listener (unmodified pi-ide).
    Compat,
    /// `pi-ide-broker mcp` (which itself dials the native socket).
    Stdio,
    /// A door plugged in (`frontdoor::plugin`).
    Plugged {
        /// Its name, as `status` shows it.
        name: &'static str,
        /// Whether its agents answer an editor's own requests (`getSuggestions`).
        answers_editor_requests: bool,
    },
}

impl Door {
    /// The name `status` shows.
    pub fn name(self) -> &'static str {
        match self {
            Door::Native => "native",
            Door::Compat => "compat",
            Door::Stdio => "stdio",
            Door::Plugged { name, .. } => name,
        }
    }

    /// Whether an editor's own request (`getSuggestions`) may be handed to its sessions.
    pub fn answers_editor_requests(self) -> bool {
        match self {
            Door::Plugged {
                answers_editor_requests,
                ..
            } => answers_editor_requests,
            _ => true,
        }
    }
}

impl Serialize for Door {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// How a session introduces itself.
#[derive(Clone, Debug)]
pub struct Intro {
    /// The door.
    pub door: Door,
    /// Its working directory, as given.
    pub cwd: String,
    /// Stable key across pi's `/new`, `/resume`, `/reload` (and broker restarts).
    pub key: Option<String>,
    /// An explicit editor choice.
    pub editor: Option<String>,
    /// The `[[remote]]` it runs on, if elsewhere: its paths are mapped both ways.
    pub remote: Option<String>,
    /// Pinned to `editor` for good (a compat entry stands for one editor): it follows that
    /// editor's restarts, is never routed elsewhere, and ends when the editor is gone.
    pub pinned: bool,
    /// The key of the session this one replaces (pi's `/new`, `/fork`): its sticky target is
    /// copied to `key` when `key` has none yet.
    pub inherit: Option<String>,
    /// The family whose tools the client speaks (`dialect` on the wire).
    pub family: Family,
    /// What the client says it is (`client`, `client_version`, `protocol` on the native door).
    pub client: Option<crate::protocol::version::ClientInfo>,
    /// An agent's realm (`frontdoor::rights`): where its connection came from when that gives
    /// an agent's rights only; `None` for the owner's sessions.
    pub realm: Option<String>,
}

/// Attachment changes, told to the session task (which resubscribes and tells its client).
#[derive(Debug)]
pub enum Control {
    /// Now attached to this editor.
    Attached(String),
    /// No longer attached, and why.
    Detached(String),
    /// The editor with the same id was replaced by its successor: resubscribe quietly.
    Rebind,
    /// An editor's notification sent before the session's first request was answered: it
    /// waits behind that answer with the other notices.
    Notice(String),
}

/// A live session as the registry sees it.
pub struct Session {
    /// Broker-assigned id.
    pub id: u64,
    /// How it came in.
    pub door: Door,
    /// The cwd as given.
    pub cwd_raw: String,
    /// The cwd normalised for routing.
    pub cwd: PathBuf,
    /// Sticky key, if any.
    pub key: Option<String>,
    /// The family whose tools it speaks (`dialect` on the wire).
    pub family: Family,
    /// What the client says it is (name, version, protocol revision), if it said.
    pub client: Option<crate::protocol::version::ClientInfo>,
    /// See [`Intro::realm`]: set, the session is an agent's and attaches only to an editor
    /// of its own folder.
    pub realm: Option<String>,
    /// When it connected.
    pub since: SystemTime,
    /// The attached editor id (shared: every call reads it).
    pub editor: Mutex<Option<Arc<str>>>,
    /// See [`Intro::pinned`].
    pub pinned: bool,
    /// The editor a pinned session stands on (its door's: [`Intro::editor`]).
    pub pinned_to: Option<Arc<str>>,
    /// Its remote's name, and the path map that goes with it.
    pub remote: Option<(String, std::sync::Arc<crate::protocol::pathmap::PathMap>)>,
    /// A path outside every prefix was logged for this session already.
    pub unmapped_said: AtomicBool,
    /// True after `broker/detach`: do not auto-attach again.
    pub detached_by_client: AtomicBool,
    /// Activity stamp (from `Registry::stamp`, not a time) of its last request to its editor
    /// or attach: the most recently active session is the one with the highest.
    pub last_active: AtomicU64,
    /// Its frame queue.
    pub outbox: Outbox,
    /// Its first request has been answered (the handshake is done): an editor's
    /// notifications go straight to its outbox from then on, and wait behind that answer
    /// before (see [`Session::notify`]).
    pub(crate) greeted: AtomicBool,
    /// Attachment changes for its task.
    pub control: mpsc::UnboundedSender<Control>,
    /// Editor-initiated requests it must answer: our id for it → (editor id, editor's id).
    pub delegated: Mutex<HashMap<String, (String, Value)>>,
    /// Mints ids for delegated requests.
    next_delegated: AtomicU64,
    /// Calls in flight that asked for progress: kept alive with `notifications/progress`.
    pub(crate) progress: Mutex<Vec<Progress>>,
    /// ACP doors following it (`session::follow`).
    pub followers: Mutex<Vec<Arc<Follower>>>,
    /// How many followers review its diffs now: read on every call, so an atomic.
    pub(crate) reviewers: AtomicUsize,
    /// Follower requests sent on to the client: our id → (follower id, the follower's id).
    pub(crate) follow_calls: Mutex<HashMap<String, (u64, Value)>>,
    /// Cancelled when the session has ended: its followers are told and let go.
    pub gone: tokio_util::sync::CancellationToken,
}

/// An ACP door (`pi-ide-broker acp`) following a session: it gets the session's transcript,
/// may prompt it, and reviews its diffs while its turn is open.
pub struct Follower {
    /// Broker-assigned id (from the session counter).
    pub id: u64,
    /// What it says it is (the ACP client's name, e.g. `Zed`).
    pub name: String,
    /// Its frame queue.
    pub outbox: Outbox,
    /// It can review a diff now (an ACP turn is open, so every client shows the request).
    pub reviewing: AtomicBool,
    /// Diffs it reviews: our request id → (the session's call id, the diff's tab name).
    pub reviews: Mutex<HashMap<String, (Value, String)>>,
    /// Its editor's buffers can be read (the ACP client offers `fs.readTextFile`).
    pub reads_buffers: bool,
    /// Buffer reads it answers: our request id → the session's call id.
    pub reads: Mutex<HashMap<String, Value>>,
    /// Mints ids for review requests.
    next_review: AtomicU64,
}

impl Follower {
    /// A follower writing to `outbox`.
    pub fn new(id: u64, name: String, outbox: Outbox, reads_buffers: bool) -> Self {
        Follower {
            id,
            name,
            outbox,
            reads_buffers,
            reads: Mutex::new(HashMap::new()),
            reviewing: AtomicBool::new(false),
            reviews: Mutex::new(HashMap::new()),
            next_review: AtomicU64::new(0),
        }
    }

    /// A fresh id for a request to this follower (`review-…`, `read-…`).
    pub fn mint_id(&self, kind: &str) -> String {
        format!(
            "{kind}-{}",
            self.next_review.fetch_add(1, Ordering::Relaxed) + 1
        )
    }
}

/// A call in flight whose client asked for progress (`_meta.progressToken`).
pub(crate) struct Progress {
    /// The editor it waits on.
    pub(crate) editor: String,
    /// The id the broker minted for it upstream.
    pub(crate) upstream: u64,
    /// The client's token, echoed exactly.
    pub(crate) token: Value,
    /// Notifications sent so far (the `progress` value, increasing).
    pub(crate) sent: u64,
}

impl Session {
    /// A new session, unattached, active as of `stamp`.
    pub fn new(
        id: u64,
        intro: &Intro,
        outbox: Outbox,
        control: mpsc::UnboundedSender<Control>,
        stamp: u64,
        map: Option<crate::protocol::pathmap::PathMap>,
    ) -> Self {
        // A remote agent's cwd is routed as the host folder it is.
        let host_cwd = map
            .as_ref()
            .and_then(|m| m.to_host(&intro.cwd).ok().flatten())
            .unwrap_or_else(|| intro.cwd.clone());
        Session {
            id,
            door: intro.door,
            cwd: crate::registry::router::normalize(std::path::Path::new(&host_cwd)),
            cwd_raw: intro.cwd.clone(),
            key: intro.key.clone(),
            family: intro.family,
            client: intro.client.clone(),
            realm: intro.realm.clone(),
            since: SystemTime::now(),
            editor: Mutex::new(None),
            pinned: intro.pinned,
            pinned_to: intro
                .pinned
                .then(|| intro.editor.as_deref().map(Arc::from))
                .flatten(),
            remote: intro.remote.clone().zip(map.map(std::sync::Arc::new)),
            unmapped_said: AtomicBool::new(false),
            detached_by_client: AtomicBool::new(false),
            last_active: AtomicU64::new(stamp),
            outbox,
            greeted: AtomicBool::new(false),
            control,
            delegated: Mutex::new(HashMap::new()),
            next_delegated: AtomicU64::new(0),
            progress: Mutex::new(Vec::new()),
            followers: Mutex::new(Vec::new()),
            reviewers: AtomicUsize::new(0),
            follow_calls: Mutex::new(HashMap::new()),
            gone: tokio_util::sync::CancellationToken::new(),
        }
    }

    /// Delivers an editor's notification: at once once the handshake is done; before, it
    /// goes to the session task, which holds it until the first answer has gone out (an MCP
    /// client expects the `initialize` answer first, and a pi-ide client may not listen yet).
    pub fn notify(&self, text: String) {
        if self.greeted.load(Ordering::Acquire) {
            self.outbox.deliver(text);
        } else {
            let _ = self.control.send(Control::Notice(text));
        }
    }

    /// The path map of its remote, if it runs elsewhere.
    pub fn map(&self) -> Option<&crate::protocol::pathmap::PathMap> {
        self.remote.as_ref().map(|(_, m)| m.as_ref())
    }

    /// A frame for this session with its paths as the agent sees them (unchanged when the
    /// session is local, or nothing in it maps).
    pub fn to_agent(&self, text: &str) -> String {
        let Some(m) = self.map() else {
            return text.to_string();
        };
        let Ok(mut v) = serde_json::from_str::<Value>(text) else {
            return text.to_string();
        };
        if m.map_json(&mut v, false) > 0 {
            v.to_string()
        } else {
            text.to_string()
        }
    }

    /// The attached editor id.
    pub fn editor_id(&self) -> Option<Arc<str>> {
        lock(&self.editor).clone()
    }

    /// Whether the session is attached to editor `id`.
    pub fn is_on(&self, id: &str) -> bool {
        lock(&self.editor).as_deref() == Some(id)
    }

    /// Records activity for "most recently active session on this editor".
    pub fn touch(&self, stamp: u64) {
        self.last_active.store(stamp, Ordering::Relaxed);
    }

    /// Ends the session (its task closes the connection and cleans up).
    pub fn close(&self) {
        self.outbox.drop_session();
    }

    /// The follower that reviews this session's diffs now, if any: the one whose turn opened
    /// last (`docs/protocol.md`, "Who reviews a diff").
    pub fn reviewer(&self) -> Option<Arc<Follower>> {
        if self.reviewers.load(Ordering::Acquire) == 0 {
            return None;
        }
        lock(&self.followers)
            .iter()
            .rev()
            .find(|f| f.reviewing.load(Ordering::Acquire))
            .cloned()
    }

    /// How many followers review its diffs now.
    pub fn reviewers(&self) -> usize {
        self.reviewers.load(Ordering::Acquire)
    }

    /// The followers it owes an answer to a forwarded call, one entry per call.
    pub fn forwarded_to(&self) -> Vec<u64> {
        lock(&self.follow_calls).values().map(|(f, _)| *f).collect()
    }

    /// A fresh id for an editor-initiated request delivered to this session.
    pub fn mint_delegated_id(&self) -> String {
        format!(
            "broker-{}",
            self.next_delegated.fetch_add(1, Ordering::Relaxed) + 1
        )
    }
}
