//! One editor: its shared handle ([`Editor`]) and the task that keeps its single upstream
//! WebSocket link alive (dial, MCP handshake, health pings, redial with backoff).
//! The handle owns the outbound id space and the pending-request table of the link.

use crate::config::Config;
use crate::family::Family;
use crate::health::{Action as HealthAction, Health};
use crate::jsonrpc::{self, Incoming};
use crate::lockfile::{self, Lockfile, LockfileError};
use crate::outbox::Outbox;
use crate::shared_writer::{Broken, Refused, SharedWriter};
use crate::sync::lock;
use crate::wsframe::{Frame, FrameReader, FrameWriter, Out, Role};
use dashmap::DashMap;
use futures_util::SinkExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;

mod taken;

/// The protocol version the broker speaks to editors.
pub const PROTOCOL_VERSION: &str = "2024-11-05";
/// How many frames may queue for one editor's socket before callers get "busy".
const OUTBOUND_QUEUE: usize = 4096;

/// The link state shown in `status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkState {
    /// Dialling, upgrading or in the MCP handshake.
    Connecting,
    /// Up and answering pings.
    Ready,
    /// Up, but a ping went unanswered for longer than `health.timeout_ms`.
    Unhealthy,
    /// Down; waiting before the next dial.
    Backoff,
    /// Down because a single-client editor closed the link for another client (the user's
    /// own Claude Code); left alone until a session calls it or the other client leaves.
    Taken,
}

/// What the link task knows about the link, for status and routing.
#[derive(Clone, Debug)]
pub struct LinkInfo {
    /// Current state.
    pub state: LinkState,
    /// Round trip of the last answered ping.
    pub rtt: Option<Duration>,
    /// When the current link came up.
    pub connected_since: Option<SystemTime>,
    /// The editor's `initialize` result, replayed to sessions.
    pub initialize: Option<Value>,
    /// The editor's `tools/list` result, replayed to sessions.
    pub tools: Option<Value>,
    /// Why the link is in its state, when the state alone does not say (`taken`).
    pub reason: Option<String>,
}

/// Who waits for the answer to a request sent upstream.
pub enum Owner {
    /// An agent session: the answer goes to its outbox with its own id restored.
    Session {
        /// The session id.
        session: u64,
        /// Where its frames go.
        outbox: Outbox,
        /// The id the session used, exactly.
        id: jsonrpc::ClientId,
    },
    /// The broker itself.
    Internal(oneshot::Sender<Map<String, Value>>),
    /// Nobody (fire and forget, e.g. a `close_tab` for an orphaned diff).
    Discard,
}

/// One request in flight on the link.
pub struct Pending {
    /// Who gets the answer.
    pub owner: Owner,
    /// The JSON-RPC method (borrowed for the common ones: no allocation per call).
    pub method: Cow<'static, str>,
    /// `params.name` for `tools/call` (borrowed for the editors' own tools: `family::tool_label`).
    pub tool: Option<Cow<'static, str>>,
    /// `tab_name` for `openDiff`: the diff this request owns.
    pub tab_name: Option<String>,
    /// When it was sent.
    pub started: Instant,
    /// When a short tool gives up (`None` for diffs and the broker's own calls): the link's
    /// deadline sweep answers it with a timeout error if the editor has not by then.
    pub deadline: Option<tokio::time::Instant>,
    /// How to rewrite the answer for a session of the other dialect (`None`: pass through).
    pub bridge: Option<crate::bridge::Bridge>,
    /// A remote session's path map: paths in the answer go back as the agent sees them.
    pub map: Option<Arc<crate::pathmap::PathMap>>,
}

impl Pending {
    /// The tab name the editor knows this diff by (a marked name on a bridged diff).
    pub fn editor_tab(&self) -> Option<&str> {
        match &self.bridge {
            Some(crate::bridge::Bridge::DiffOnClaude { editor_tab, .. }) => Some(editor_tab),
            _ => self.tab_name.as_deref(),
        }
    }

    /// True for an `openDiff` tool call (which never times out and is answered
    /// `DIFF_REJECTED` when it cannot be answered for real).
    pub fn is_diff(&self) -> bool {
        self.tab_name.is_some()
    }
}

/// An editor-initiated request handed to a session: which session, under which id.
#[derive(Clone, Debug)]
pub struct Delegation {
    /// The session that must answer.
    pub session: u64,
    /// The id the session sees.
    pub session_id: String,
}

/// Where an editor stands in its id's succession chain (see `identity`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Succession {
    /// How many successions its id has seen.
    pub restarts: u32,
    /// The predecessor's port.
    pub previous_port: Option<u16>,
    /// The predecessor's pid.
    pub previous_pid: Option<u32>,
}

/// A session's call in flight on an editor, as `status` shows it.
#[derive(Debug, Clone)]
pub struct CallInFlight {
    /// An `openDiff` (status lists diffs first: they wait on a person).
    pub diff: bool,
    /// The JSON-RPC method.
    pub method: String,
    /// The tool, for a `tools/call`.
    pub tool: Option<String>,
    /// How long it has been in flight.
    pub age: Duration,
}

/// Shared handle to one editor. Lives in the registry; the link task and sessions use it.
pub struct Editor {
    /// Stable id: held by this editor process for its life and across broker restarts,
    /// inherited by its successor (see `identity`).
    pub id: String,
    /// Dialect and auth header.
    pub family: Family,
    /// The lockfile as last read (token included, redacted in Debug).
    lock: Mutex<Lockfile>,
    /// Workspace folders, normalised for routing.
    pub folders: Vec<PathBuf>,
    /// How many times this editor restarted (successor chain length).
    pub restarts: u32,
    /// The port of the editor this one replaced, if any.
    pub previous_port: Option<u16>,
    /// The pid of the editor this one replaced, if any (shown so a user sees why sessions
    /// followed it).
    pub previous_pid: Option<u32>,
    /// Link state for status and routing.
    link: Mutex<LinkInfo>,
    /// The write half of the live link; empty while down.
    out: SharedWriter<LinkSink, Out>,
    /// Requests in flight, by the id the broker minted (private: the invariants of the
    /// pending table live in this module's methods).
    pending: DashMap<u64, Pending, rustc_hash::FxBuildHasher>,
    /// Deadlines of the short tools in flight, earliest first: one sweep per link, no timer
    /// task per request.
    deadlines: Mutex<BinaryHeap<Reverse<(tokio::time::Instant, u64)>>>,
    /// Woken when a new deadline may be the earliest.
    deadline_added: tokio::sync::Notify,
    /// The next id to mint (numbers below 2^53, safe for Lua doubles).
    next_id: AtomicU64,
    /// The latest `selection_changed` frame: coalesces for slow sessions and replays on attach.
    selection: watch::Sender<Option<Arc<str>>>,
    /// Activity stamp (from `LinkHost::stamp`, not a time) of the last `selection_changed`
    /// (0 = never): the editor the user touched last has the highest.
    focus: AtomicU64,
    /// Editor-initiated requests handed to a session, by the editor's id (as JSON text).
    delegated: DashMap<String, Delegation>,
    /// Cancelled when the editor is gone; stops the link task.
    cancel: CancellationToken,
    /// Woken by a call to a `taken` editor: a session needs it, so the link is dialled again.
    wanted: tokio::sync::Notify,
    /// Calls made while another client holds the editor, waiting for the link dialled for
    /// them (see `taken`).
    parked: Mutex<Vec<taken::Parked>>,
    /// Parked calls written on the current (or coming) link, kept until it ends: one cut by
    /// the editor's close before its answer came may be sent once more (see `taken`).
    sent: Mutex<Vec<taken::Parked>>,
    /// The current (or coming) link was dialled for calls while another client held the
    /// editor: it is handed back once idle.
    reclaimed: std::sync::atomic::AtomicBool,
    /// Session calls sent, ever (the hand-back waits until it stops moving).
    calls: AtomicU64,
}

/// Why a request could not be sent upstream.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The link is down.
    #[error("editor {0} is not connected ({1}); it is being redialled, retry shortly")]
    Down(String, &'static str),
    /// The editor is not reading its socket fast enough.
    #[error("editor {0} is not keeping up (outbound queue full)")]
    Busy(String),
}

impl Editor {
    /// A new handle for a validated lockfile; the link task is started separately.
    pub fn new(
        id: String,
        lock: Lockfile,
        folders: Vec<PathBuf>,
        succession: Succession,
        cancel: CancellationToken,
    ) -> Self {
        Editor {
            id,
            family: lock.family,
            lock: Mutex::new(lock),
            folders,
            restarts: succession.restarts,
            previous_port: succession.previous_port,
            previous_pid: succession.previous_pid,
            link: Mutex::new(LinkInfo {
                state: LinkState::Connecting,
                rtt: None,
                connected_since: None,
                initialize: None,
                tools: None,
                reason: None,
            }),
            out: SharedWriter::default(),
            pending: DashMap::default(),
            deadlines: Mutex::new(BinaryHeap::new()),
            deadline_added: tokio::sync::Notify::new(),
            next_id: AtomicU64::new(1),
            selection: watch::Sender::new(None),
            focus: AtomicU64::new(0),
            delegated: DashMap::new(),
            cancel,
            wanted: tokio::sync::Notify::new(),
            parked: Mutex::new(Vec::new()),
            sent: Mutex::new(Vec::new()),
            reclaimed: std::sync::atomic::AtomicBool::new(false),
            calls: AtomicU64::new(0),
        }
    }

    /// Takes a re-read lockfile of this same editor (a new token).
    pub fn set_lockfile(&self, l: Lockfile) {
        *lock(&self.lock) = l;
    }

    /// Stops the link task: the editor is gone (or replaced).
    pub fn stop(&self) {
        self.cancel.cancel();
    }

    /// The latest `selection_changed` frame, if the editor sent one.
    pub fn last_selection(&self) -> Option<Arc<str>> {
        self.selection.borrow().clone()
    }

    /// A receiver of the editor's selection, marked changed when there is one already (so a
    /// new subscriber gets it replayed).
    pub fn subscribe_selection(&self) -> watch::Receiver<Option<Arc<str>>> {
        let mut rx = self.selection.subscribe();
        if rx.borrow().is_some() {
            rx.mark_changed();
        }
        rx
    }

    /// The activity stamp of the user's last touch (`selection_changed`), if any.
    pub fn focus_stamp(&self) -> Option<u64> {
        Some(self.focus.load(Ordering::Relaxed)).filter(|v| *v > 0)
    }

    /// A copy of the lockfile as last read.
    pub fn lockfile(&self) -> Lockfile {
        lock(&self.lock).clone()
    }

    /// A copy of the link info.
    pub fn link_info(&self) -> LinkInfo {
        lock(&self.link).clone()
    }

    /// The names in the editor's `tools/list`, or `None` before it has answered one.
    pub fn tool_names(&self) -> Option<Vec<String>> {
        let link = lock(&self.link);
        let list = link.tools.as_ref()?.get("tools")?.as_array()?;
        Some(
            list.iter()
                .filter_map(|t| t.get("name")?.as_str().map(String::from))
                .collect(),
        )
    }

    /// The current state.
    pub fn state(&self) -> LinkState {
        lock(&self.link).state
    }

    /// True when requests can be sent (ready, or unhealthy but still connected).
    pub fn usable(&self) -> bool {
        matches!(self.state(), LinkState::Ready | LinkState::Unhealthy)
    }

    /// True when sessions may be routed here: usable, or taken by another client (its calls
    /// are still answered: the broker links for them).
    pub fn routable(&self) -> bool {
        matches!(
            self.state(),
            LinkState::Ready | LinkState::Unhealthy | LinkState::Taken
        )
    }

    /// Sets the link state (the link task's; the registry's model test plays a link).
    pub(crate) fn set_state(&self, state: LinkState) {
        lock(&self.link).state = state;
    }

    /// Sends a request upstream under a freshly minted id; the answer goes to `pending.owner`.
    /// `msg` is the whole JSON-RPC object; its `id` is replaced. Returns the minted id.
    pub fn send_request(
        &self,
        mut msg: Map<String, Value>,
        pending: Pending,
    ) -> Result<u64, SendError> {
        let tools_call = pending.method == "tools/call";
        self.send_built(
            move |uid| {
                msg.insert("id".into(), uid.into());
                if tools_call {
                    if let Some(Value::Object(params)) = msg.get_mut("params") {
                        params.entry("arguments").or_insert_with(|| json!({}));
                    }
                }
                Value::Object(msg).to_string()
            },
            pending,
        )
    }

    /// Sends a request whose frame `build` writes for the minted id (the hot path splices the
    /// client's bytes in without building a tree); the answer goes to `pending.owner`.
    pub fn send_built(
        &self,
        build: impl FnOnce(u64) -> String,
        pending: Pending,
    ) -> Result<u64, SendError> {
        let uid = mint_id(&self.next_id);
        let text = build(uid);
        let deadline = pending.deadline;
        if matches!(pending.owner, Owner::Session { .. }) {
            self.calls.fetch_add(1, Ordering::Relaxed);
        }
        self.pending.insert(uid, pending);
        if let Some(at) = deadline {
            let earliest = {
                let mut heap = lock(&self.deadlines);
                heap.push(Reverse((at, uid)));
                heap.peek().is_some_and(|Reverse((first, _))| *first == at)
            };
            if earliest {
                self.deadline_added.notify_one();
            }
        }
        // No link: a call to an editor another client holds waits for the link dialled for it.
        let sent = self
            .out
            .send_or(Out::Text(text), |frame| self.park(uid, frame, deadline));
        if let Err(r) = sent {
            self.pending.remove(&uid);
            return Err(self.refusal(r));
        }
        Ok(uid)
    }

    /// The upstream id of `session`'s call that it sent under `id`, if still in flight.
    pub fn pending_of(&self, session: u64, id: &Value) -> Option<u64> {
        self.pending.iter().find_map(|p| match &p.owner {
            Owner::Session {
                session: s, id: i, ..
            } if *s == session && i.is(id) => Some(*p.key()),
            _ => None,
        })
    }

    /// Removes a call from the pending table without answering it (its timer stopped).
    pub fn forget_pending(&self, upstream: u64) -> Option<Pending> {
        let (_, p) = self.pending.remove(&upstream)?;
        Some(p)
    }

    /// True while the call sent upstream under `upstream` waits for its answer.
    pub fn is_pending(&self, upstream: u64) -> bool {
        self.pending.contains_key(&upstream)
    }

    /// Takes every call `session` has in flight out of the table (unanswered): the session
    /// is gone.
    pub fn take_calls_of(&self, session: u64) -> Vec<Pending> {
        let mine: Vec<u64> = self
            .pending
            .iter()
            .filter(|p| matches!(&p.owner, Owner::Session { session: s, .. } if *s == session))
            .map(|p| *p.key())
            .collect();
        mine.into_iter()
            .filter_map(|uid| self.pending.remove(&uid).map(|(_, p)| p))
            .collect()
    }

    /// What `session` has in flight on this editor, for status.
    pub fn calls_of(&self, session: u64) -> Vec<CallInFlight> {
        self.pending
            .iter()
            .filter(|p| matches!(&p.owner, Owner::Session { session: s, .. } if *s == session))
            .map(|p| CallInFlight {
                diff: p.is_diff(),
                method: p.method.to_string(),
                tool: p.tool.as_deref().map(String::from),
                age: p.started.elapsed(),
            })
            .collect()
    }

    /// Forgets an editor-initiated request (answered, or its session gone); false when it
    /// was not pending any more (cancelled by the editor meanwhile).
    pub fn forget_delegated(&self, editor_id: &Value) -> bool {
        self.delegated.remove(&editor_id.to_string()).is_some()
    }

    /// Records that the editor's request `editor_id` was handed to a session. Done before the
    /// session can see the request: its answer may come back on another thread at once.
    pub fn track_delegated(&self, editor_id: &Value, d: Delegation) {
        self.delegated.insert(editor_id.to_string(), d);
    }

    /// The earliest short-tool deadline, if any.
    fn next_deadline(&self) -> Option<tokio::time::Instant> {
        lock(&self.deadlines).peek().map(|Reverse((at, _))| *at)
    }

    /// Answers every short tool whose deadline has passed with a timeout error (the answer,
    /// if the editor sends one later, is dropped as late). Also drops the deadlines of calls
    /// already answered from the front, so the next wake-up is the earliest call still owed:
    /// otherwise every answered call would wake the link once more when its deadline passed.
    fn expire_deadlines(&self, now: tokio::time::Instant) {
        loop {
            let Some(Reverse((at, uid))) = lock(&self.deadlines).peek().copied() else {
                return;
            };
            let due = at <= now;
            if !due && self.pending.contains_key(&uid) {
                return;
            }
            {
                // Only this task pops; a sender may have pushed an earlier one meanwhile.
                let mut heap = lock(&self.deadlines);
                if heap.peek().is_some_and(|Reverse((_, first))| *first == uid) {
                    heap.pop();
                }
            }
            if !due {
                continue; // answered in time
            }
            let Some((_, p)) = self.pending.remove(&uid) else {
                continue; // answered in time
            };
            let label = p.tool.as_deref().unwrap_or(&p.method).to_string();
            let ms = p.started.elapsed().as_millis();
            tracing::warn!(editor = %self.id, call = %label, waited_ms = ms as u64, "editor did not answer in time");
            if let Owner::Session { outbox, id, .. } = p.owner {
                outbox.deliver(jsonrpc::error(
                    &id.value(),
                    jsonrpc::TIMEOUT,
                    &format!("editor {} did not answer {label} within {ms} ms", self.id),
                ));
            }
        }
    }

    /// A broker-originated request whose answer nobody awaits.
    pub fn send_discard(&self, method: &'static str, params: Value) -> Result<u64, SendError> {
        let mut msg = Map::new();
        msg.insert("jsonrpc".into(), "2.0".into());
        msg.insert("method".into(), method.into());
        msg.insert("params".into(), params);
        let tool = msg
            .get("params")
            .and_then(|p| p.get("name"))
            .and_then(Value::as_str)
            .map(crate::family::tool_label);
        self.send_request(
            msg,
            Pending {
                owner: Owner::Discard,
                method: method.into(),
                tool,
                tab_name: None,
                started: Instant::now(),
                deadline: None,
                bridge: None,
                map: None,
            },
        )
    }

    /// Asks the editor to close the diff tab `tab` (a broker-owned request: nobody awaits
    /// the answer, and a shutting-down link waits for it before closing).
    pub fn close_tab(&self, tab: &str) -> Result<u64, SendError> {
        self.send_discard(
            "tools/call",
            json!({"name": "close_tab", "arguments": {"tab_name": tab}}),
        )
    }

    /// Sends a frame that needs no answer (notification, or a response to the editor).
    pub fn send_raw(&self, text: String) -> Result<(), SendError> {
        self.send_frame(Out::Text(text))
    }

    /// Puts one frame on the link: written now by the calling task when the link is idle,
    /// else queued for its writer task (see `shared_writer`).
    fn send_frame(&self, frame: Out) -> Result<(), SendError> {
        self.out.send(frame).map_err(|r| self.refusal(r))
    }

    /// Why a frame was refused, for the caller.
    fn refusal(&self, r: Refused) -> SendError {
        match r {
            Refused::Full => SendError::Busy(self.id.clone()),
            Refused::Broken => SendError::Down(self.id.clone(), "closing"),
            // Read only on this path: a send that goes through takes no other lock.
            Refused::Gone => SendError::Down(
                self.id.clone(),
                match self.state() {
                    LinkState::Connecting => "connecting",
                    LinkState::Backoff => "backoff",
                    LinkState::Ready => "ready",
                    LinkState::Unhealthy => "unhealthy",
                    LinkState::Taken => {
                        // A session needs the editor: the link task dials it again now.
                        self.wanted.notify_one();
                        "taken by another client"
                    }
                },
            ),
        }
    }

    /// Answers every pending `openDiff` with `DIFF_REJECTED` (the session's own tab name)
    /// and closes it in the editor; the link stays up. Used on shutdown.
    pub fn reject_pending_diffs(&self, why: &str) {
        let diffs: Vec<u64> = self
            .pending
            .iter()
            .filter(|p| p.is_diff())
            .map(|p| *p.key())
            .collect();
        for uid in diffs {
            let Some((_, p)) = self.pending.remove(&uid) else {
                continue;
            };
            if let Owner::Session { outbox, id, .. } = &p.owner {
                let tab = p.tab_name.clone().unwrap_or_default();
                tracing::info!(editor = %self.id, reason = why, "rejecting a pending diff");
                outbox.deliver(jsonrpc::result(
                    &id.value(),
                    jsonrpc::diff_undelivered(&tab, why),
                ));
                let _ = self.close_tab(p.editor_tab().unwrap_or_default());
            }
        }
    }

    /// Answers a session's call that did not reach the editor: a diff `DIFF_REJECTED` with
    /// its own tab name (never an error, never `FILE_SAVED`), the rest an error.
    fn undelivered(&self, p: Pending, why: &str) {
        if let Owner::Session { outbox, id, .. } = p.owner {
            let text = match &p.tab_name {
                Some(tab) => jsonrpc::result(
                    &id.value(),
                    jsonrpc::diff_undelivered(tab, &format!("editor {why}")),
                ),
                None => jsonrpc::error(
                    &id.value(),
                    jsonrpc::NO_EDITOR,
                    &format!("editor {} {why}", self.id),
                ),
            };
            outbox.deliver(text);
        }
    }

    /// Answers every request in flight after the link is lost: diffs get `DIFF_REJECTED`
    /// with their own tab name (never an error, never `FILE_SAVED`), the rest an error.
    /// Calls parked for the next link (one cut by the editor's close, to be sent again) are
    /// kept, with their deadlines.
    pub fn fail_pending(&self, why: &str) {
        let parked = self.parked_uids();
        let ids: Vec<u64> = self.pending.iter().map(|e| *e.key()).collect();
        for uid in ids {
            if parked.contains(&uid) {
                continue;
            }
            let Some((_, p)) = self.pending.remove(&uid) else {
                continue;
            };
            self.undelivered(p, &format!("link lost: {why}"));
        }
        lock(&self.deadlines).retain(|Reverse((_, uid))| parked.contains(uid));
        // Editor-initiated requests die with the link; the editor fails them itself.
        self.delegated.clear();
    }
}

/// What the link task needs from the rest of the broker.
pub trait LinkHost: Send + Sync + 'static {
    /// The current config (it may be reloaded).
    fn config(&self) -> Arc<Config>;
    /// A strictly increasing, non-zero stamp ordering "who was touched last".
    fn stamp(&self) -> u64;
    /// The link state changed (status watchers wake up).
    fn state_changed(&self);
    /// The link became ready (sessions waiting for this editor can attach).
    fn editor_ready(&self, editor: &Arc<Editor>);
    /// The editor is gone for good (pid dead or lockfile gone).
    fn editor_gone(&self, editor: &Arc<Editor>, reason: String);
    /// A notification other than `selection_changed` for every session on this editor.
    fn broadcast(&self, editor: &Arc<Editor>, text: &str);
    /// An editor-initiated request: hand it to the right session (recorded with
    /// [`Editor::track_delegated`] before the session can answer); false if there is none.
    fn delegate(&self, editor: &Arc<Editor>, id: &Value, msg: Map<String, Value>) -> bool;
    /// `request_cancelled` for a delegated request: forward to its session.
    fn cancel_delegated(&self, editor: &Arc<Editor>, d: &Delegation);
    /// Where the link's own tasks run (its socket's writer task), so a stop waits for them.
    fn tracker(&self) -> &tokio_util::task::TaskTracker;
}

/// Why a link ended.
enum LinkEnd {
    Cancelled,
    Closed(String),
    /// The editor closed it (a close frame or the end of the stream).
    EditorClosed(String),
    /// Taken back for calls while another client held the editor, and idle since: closed so
    /// that client can have it again.
    HandedBack,
}

/// Why a dial failed.
#[derive(Debug, thiserror::Error)]
enum DialError {
    #[error("the editor refused our token (HTTP 400); will re-read its lockfile")]
    Refused,
    /// The editor closed the link (a Close frame, answered, or the end of the stream) before
    /// the handshake was done: the link `client_port` is not ready, whatever was answered.
    #[error("{why}")]
    Closed { why: String, client_port: u16 },
    /// The editor answered a handshake request with an error; the link itself is alive.
    #[error("{0}")]
    Answered(String),
    #[error("{0}")]
    Other(String),
}

/// Runs the link of one editor until it is cancelled or the editor is gone for good.
/// Spawn it inside [`span`] so its debug lines name the editor (its info lines and above do it
/// themselves).
pub async fn run(editor: Arc<Editor>, host: Arc<dyn LinkHost>) {
    let mut backoff = Backoff::new(&host.config());
    loop {
        if !still_there(&editor, &*host) {
            return;
        }
        let config = host.config();
        editor.set_state(LinkState::Connecting);
        host.state_changed();
        let handshake = Duration::from_millis(config.timeouts.handshake_ms);
        let dialled = tokio::select! {
            _ = editor.cancel.cancelled() => return,
            r = tokio::time::timeout(handshake, dial(&editor, &config, &*host)) => r,
        };
        match dialled {
            Ok(Ok(link)) => {
                backoff.reset();
                match after_link(&editor, &*host, link, &config).await {
                    AfterLink::Stop => return,
                    AfterLink::Dial => continue,
                    AfterLink::Backoff => {}
                }
            }
            Ok(Err(e)) => {
                let taken = match &e {
                    DialError::Refused => {
                        tracing::warn!(editor = %editor.id, "{e}");
                        None
                    }
                    DialError::Closed { client_port, .. } => {
                        tracing::debug!(error = %e, "dial failed");
                        let taken = taken::taken_by_another(&editor, &config, *client_port);
                        // A single-client editor closed it for its other client: the calls
                        // written in the handshake and not answered may go once more.
                        if taken.is_some() || editor.reclaimed.load(Ordering::Acquire) {
                            editor.requeue_cut();
                        }
                        taken
                    }
                    DialError::Answered(_) | DialError::Other(_) => {
                        tracing::debug!(error = %e, "dial failed");
                        None
                    }
                };
                editor.fail_sent(&format!("link lost: {e}"));
                // Taken with nothing to send: yield as for a live link it closed. Calls still
                // parked are sent by the next dial, after the backoff.
                if let Some(reason) = taken.filter(|_| lock(&editor.parked).is_empty()) {
                    if !taken::wait_while_taken(&editor, &*host, reason, Duration::ZERO).await {
                        return;
                    }
                    continue;
                }
            }
            Err(_) => {
                tracing::warn!(
                    editor = %editor.id,
                    timeout_ms = config.timeouts.handshake_ms,
                    "editor handshake timed out"
                );
                editor.fail_sent("link lost: the handshake timed out");
            }
        }
        editor.set_state(LinkState::Backoff);
        host.state_changed();
        if !taken::pause(&editor, backoff.next()).await {
            return;
        }
    }
}

/// What the link task does once a live link has ended.
enum AfterLink {
    /// The editor is gone: the task ends.
    Stop,
    /// Dial again now (the editor is free again, or a session needs it).
    Dial,
    /// Lost: dial again after the backoff.
    Backoff,
}

/// Runs a dialled link to its end, answers what was in flight, and says what comes next: a
/// link the editor closed for another client (or one handed back to it) waits while taken.
async fn after_link(
    editor: &Arc<Editor>,
    host: &dyn LinkHost,
    link: Dialled,
    config: &Config,
) -> AfterLink {
    let client_port = link.client_port;
    let end = run_link(editor, host, link, config).await;
    editor.out.discard();
    {
        let mut l = lock(&editor.link);
        l.connected_since = None;
        l.state = LinkState::Backoff;
    }
    let why = match &end {
        LinkEnd::Cancelled => "editor gone".to_string(),
        LinkEnd::HandedBack => "handed back to the other client".to_string(),
        LinkEnd::Closed(r) | LinkEnd::EditorClosed(r) => r.clone(),
    };
    let taken = match end {
        LinkEnd::Cancelled => None,
        LinkEnd::HandedBack => Some((taken::handed_back_reason(), taken::SETTLE)),
        LinkEnd::EditorClosed(_) => {
            let taken = taken::taken_by_another(editor, config, client_port);
            // Closed for the editor's other client: parked calls cut before their answer
            // came may go once more, on the link dialled for them.
            if taken.is_some() || editor.reclaimed.load(Ordering::Acquire) {
                editor.requeue_cut();
            }
            taken.map(|r| (r, Duration::ZERO))
        }
        LinkEnd::Closed(_) => None,
    };
    editor.fail_sent(&format!("link lost: {why}"));
    editor.fail_pending(&why);
    host.state_changed();
    if matches!(end, LinkEnd::Cancelled) {
        return AfterLink::Stop;
    }
    let Some((reason, settle)) = taken else {
        tracing::warn!(editor = %editor.id, reason = %why, "editor link lost; redialling");
        return AfterLink::Backoff;
    };
    if taken::wait_while_taken(editor, host, reason, settle).await {
        AfterLink::Dial
    } else {
        AfterLink::Stop
    }
}

/// Before every dial: the lockfile must still be there, name this editor and its pid be alive
/// (the re-read lockfile is taken: a new token). False once the editor is gone (told to `host`).
fn still_there(editor: &Arc<Editor>, host: &dyn LinkHost) -> bool {
    let path = editor.lockfile().path;
    match lockfile::read(&path, editor.family) {
        Ok(fresh) => {
            let mut current = lock(&editor.lock);
            if fresh.port != current.port || fresh.pid != current.pid {
                // A different editor now: the registry will replace us on its Upsert.
                drop(current);
                host.editor_gone(editor, "lockfile now names another editor".into());
                return false;
            }
            *current = fresh;
            true
        }
        Err(LockfileError::Incomplete) => true,
        Err(e) => {
            tracing::info!(editor = %editor.id, reason = %e, "editor gone");
            host.editor_gone(editor, e.to_string());
            false
        }
    }
}

/// The tracing span of an editor's link task, at debug level: entering this span and the
/// session's on every poll cost about 1.5 k instructions a call, so at the default level
/// (info) they are off, and the link's info lines and above name the editor themselves.
pub fn span(editor: &Editor) -> tracing::Span {
    tracing::debug_span!("editor", id = %editor.id, port = editor.lockfile().port)
}

/// The read half of an editor link.
type LinkReader = FrameReader<OwnedReadHalf>;
/// The write half of an editor link, shared by its senders.
type LinkSink = FrameWriter<OwnedWriteHalf>;

/// A dialled link: both halves, and the socket's acknowledgement switch.
struct Dialled {
    reader: LinkReader,
    writer: LinkSink,
    quick_ack: crate::quickack::QuickAck,
    /// The link's own local port (told apart from other clients of the editor).
    client_port: u16,
}

/// Dial, upgrade with the family's auth header, `initialize`, `notifications/initialized`,
/// `tools/list`. On success the link info holds the cached results.
///
/// A dial for parked calls (a single-client editor taken back from its other client, which
/// comes back within a few ms and has the link closed) does not wait for round trips: right
/// after the upgrade it writes `initialize`, `notifications/initialized`, `tools/list` (only
/// while the editor's tools are unknown) and the parked calls back to back, then reads the
/// answers; a call's answer that comes meanwhile goes to its session at once.
///
/// A Close (answered) or the end of the stream before the handshake is done fails the dial
/// (`DialError::Closed`), even when `initialize` was answered: a link is never declared ready
/// on a `tools/list` that failed because the link died.
async fn dial(
    editor: &Arc<Editor>,
    config: &Config,
    host: &dyn LinkHost,
) -> Result<Dialled, DialError> {
    let lf = editor.lockfile();
    let mut stream = TcpStream::connect(("127.0.0.1", lf.port))
        .await
        .map_err(|e| DialError::Other(format!("connect 127.0.0.1:{}: {e}", lf.port)))?;
    let _ = stream.set_nodelay(true);
    let client_port = stream.local_addr().map(|a| a.port()).unwrap_or(0);
    let read_ahead = crate::wsupgrade::upgrade(
        &mut stream,
        crate::wsupgrade::Dial {
            port: lf.port,
            auth_header: lf.family.auth_header(),
            token: lf.auth_token.as_ref().map(|t| t.expose()),
            subprotocol: lf.family.subprotocol(),
        },
    )
    .await
    .map_err(|e| match e {
        crate::wsupgrade::UpgradeError::Refused => DialError::Refused,
        e => DialError::Other(format!("upgrade: {e}")),
    })?;
    let quick_ack = crate::quickack::QuickAck::new(&stream);
    let (rd, wr) = stream.into_split();
    let mut link = Handshake {
        editor,
        host,
        reader: FrameReader::new(rd, Role::Client, config.max_frame_bytes, &read_ahead),
        writer: FrameWriter::new(wr, Role::Client),
        client_port,
    };
    let init_params = json!({
        "protocolVersion": PROTOCOL_VERSION,
        "capabilities": {},
        "clientInfo": {"name": "pi-ide-broker", "version": env!("CARGO_PKG_VERSION")},
    });
    let initialized = || {
        Out::Text(jsonrpc::notification(
            "notifications/initialized",
            json!({}),
        ))
    };
    let parked = editor.parked_for_dial();
    let (init, tools) = if parked.is_empty() {
        let init = link.call("initialize", init_params).await?;
        link.write(&mut [initialized()].into_iter()).await?;
        let uid = link.request("tools/list").await?;
        (init, link.tools(uid).await?)
    } else {
        link.pipelined(init_params, initialized(), parked).await?
    };
    let Handshake { reader, writer, .. } = link;
    let mut l = lock(&editor.link);
    l.initialize = Some(init);
    l.tools = tools.or(Some(json!({"tools": []})));
    l.connected_since = Some(SystemTime::now());
    Ok(Dialled {
        client_port,
        reader,
        writer,
        quick_ack,
    })
}

/// A link in its MCP handshake: requests written by the dial itself, answers read (and
/// whatever else comes meanwhile handled) until the ones it waits for.
struct Handshake<'a> {
    editor: &'a Arc<Editor>,
    host: &'a dyn LinkHost,
    reader: LinkReader,
    writer: LinkSink,
    client_port: u16,
}

impl Handshake<'_> {
    /// The handshake of a dial for parked calls, without waiting for round trips: writes
    /// `initialize`, `notifications/initialized`, `tools/list` (only while the editor's tools
    /// are unknown) and the parked calls back to back, then reads the answers it needs.
    async fn pipelined(
        &mut self,
        init_params: Value,
        initialized: Out,
        parked: Vec<Out>,
    ) -> Result<(Value, Option<Value>), DialError> {
        let editor = self.editor;
        let known = editor.tool_names().is_some_and(|t| !t.is_empty());
        let init_uid = mint_id(&editor.next_id);
        let list_uid = (!known).then(|| mint_id(&editor.next_id));
        let mut frames = vec![
            Out::Text(jsonrpc::request(
                &init_uid.into(),
                "initialize",
                init_params,
            )),
            initialized,
        ];
        if let Some(uid) = list_uid {
            frames.push(Out::Text(jsonrpc::request(
                &uid.into(),
                "tools/list",
                json!({}),
            )));
        }
        frames.extend(parked);
        self.write(&mut frames.into_iter()).await?;
        let init = self.answer(init_uid, "initialize").await?;
        let tools = match list_uid {
            Some(uid) => self.tools(uid).await?,
            None => lock(&editor.link).tools.clone(),
        };
        Ok((init, tools))
    }

    /// The dial fails: the editor closed the link.
    fn closed(&self, why: &str) -> DialError {
        DialError::Closed {
            why: why.to_string(),
            client_port: self.client_port,
        }
    }

    /// Writes `frames` back to back (one flush).
    async fn write(
        &mut self,
        frames: &mut (dyn Iterator<Item = Out> + Send),
    ) -> Result<(), DialError> {
        for f in frames {
            self.writer
                .feed(f)
                .await
                .map_err(|e| DialError::Other(e.to_string()))?;
        }
        self.writer
            .flush()
            .await
            .map_err(|e| DialError::Other(e.to_string()))
    }

    /// Writes the request `method` (no params) under a minted id, which it returns.
    async fn request(&mut self, method: &str) -> Result<u64, DialError> {
        let uid = mint_id(&self.editor.next_id);
        let frame = Out::Text(jsonrpc::request(&uid.into(), method, json!({})));
        self.write(&mut std::iter::once(frame)).await?;
        Ok(uid)
    }

    /// One request, and its answer.
    async fn call(&mut self, method: &str, params: Value) -> Result<Value, DialError> {
        let uid = mint_id(&self.editor.next_id);
        let frame = Out::Text(jsonrpc::request(&uid.into(), method, params));
        self.write(&mut std::iter::once(frame)).await?;
        self.answer(uid, method).await
    }

    /// The answer to `tools/list` (sent as `uid`), normalised; `None` when the editor answered
    /// it with an error (it still works; its tool list is just unknown). A link that died
    /// meanwhile fails the dial.
    async fn tools(&mut self, uid: u64) -> Result<Option<Value>, DialError> {
        match self.answer(uid, "tools/list").await {
            Ok(mut t) => {
                // Every client gets valid JSON-Schema objects (Lua editors send `[]` for `{}`).
                crate::schema::normalize_tools(&mut t);
                Ok(Some(t))
            }
            Err(DialError::Answered(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Reads until the answer to `uid`, handling whatever else comes meanwhile (pings, the
    /// answers to calls written in the same handshake, notifications). A Close is answered
    /// with its own code, and the editor given a bounded second to close the connection.
    async fn answer(&mut self, uid: u64, method: &str) -> Result<Value, DialError> {
        loop {
            let frame = match self.reader.next().await {
                Ok(Some(f)) => f,
                Ok(None) => return Err(self.closed("closed during handshake")),
                Err(e) => return Err(DialError::Other(e.to_string())),
            };
            let text = match frame {
                Frame::Ping(p) => {
                    let pong = Out::Pong(p.to_vec());
                    self.write(&mut std::iter::once(pong)).await?;
                    continue;
                }
                Frame::Close(c) => {
                    let code = c.unwrap_or(1000);
                    if self.writer.send(Out::Close(code)).await.is_ok() {
                        let reader = &mut self.reader;
                        let _ = tokio::time::timeout(CLOSE_WAIT, async {
                            while let Ok(Some(_)) = reader.next().await {}
                        })
                        .await;
                    }
                    let code = c.map_or_else(|| "no code".into(), |c| c.to_string());
                    return Err(self.closed(&format!("closed by editor during handshake ({code})")));
                }
                other => match frame_str(&other) {
                    Some(t) => t,
                    None => continue,
                },
            };
            if let Ok(Incoming::Response { id, msg }) = jsonrpc::classify(text) {
                if id.as_u64() == Some(uid) {
                    return match msg.get("result") {
                        Some(r) => Ok(r.clone()),
                        None => Err(DialError::Answered(format!(
                            "{method} failed: {}",
                            msg.get("error").cloned().unwrap_or(Value::Null)
                        ))),
                    };
                }
            }
            // Anything else: an answer to a call written in this handshake goes to its owner.
            handle_editor_frame(self.editor, self.host, text);
        }
    }
}

/// The text of a data frame, read in place (binary frames are treated as text, as the
/// editors do).
fn frame_str<'a>(frame: &Frame<'a>) -> Option<&'a str> {
    match *frame {
        Frame::Text(t) => Some(t),
        Frame::Binary(b) => std::str::from_utf8(b).ok(),
        _ => None,
    }
}

/// The live link: this loop reads every frame (what senders send is written through
/// `editor.out`, see `shared_writer`), pings on the health interval and marks the link unhealthy (then drops it) when
/// pongs stop. Each wake-up is handled by a named step of [`Live`]; the loop only says which
/// wake-up came, in the order that keeps the invariants below.
async fn run_link(
    editor: &Arc<Editor>,
    host: &dyn LinkHost,
    link: Dialled,
    config: &Config,
) -> LinkEnd {
    let (mut live, mut reader, quick_ack, broken) = Live::start(editor, host, link, config);
    // Made once and reset only when the wake time moves (a new timer or token registration
    // per frame would cost a timer-wheel insert and removal per call), and polled only once
    // they have woken the task (`WhenWoken`): the link is cancelled once in its life, and a
    // turn for an answer does not poll the timer.
    let cancelled = editor.cancel.cancelled();
    tokio::pin!(cancelled);
    let mut cancelled = crate::woken::WhenWoken::new(cancelled);
    let deadline_added = editor.deadline_added.notified();
    tokio::pin!(deadline_added);
    let sleep = tokio::time::sleep_until(live.health.next_wake());
    tokio::pin!(sleep);
    let mut sleep = crate::woken::WhenWoken::new(sleep);
    let write_failed = broken.failed();
    tokio::pin!(write_failed);
    let mut write_failed = crate::woken::WhenWoken::new(write_failed);
    let end = loop {
        if let Some(end) = live.drained() {
            break end;
        }
        live.rearm(&mut sleep);
        // Biased, in this order: the cancellation and the timer first, so a flood of frames
        // cannot starve the health checks and the deadline sweep (tokio's budget stops the
        // stream once per turn); then the editor's frames before the other wake-ups, so a
        // wake-up for an answer checks only two flags first. No branch writes: frames go out
        // through `editor.out` (`shared_writer`) alone, its writer task finishing what
        // senders could not.
        let step = tokio::select! {
            biased;
            _ = &mut cancelled, if live.draining.is_none() => live.start_draining(),
            _ = &mut sleep => live.on_tick(),
            frame = reader.next() => live.on_frame(frame),
            // A short tool with an earlier deadline than we sleep to.
            _ = &mut deadline_added => {
                deadline_added.set(editor.deadline_added.notified());
                Step::Rewake
            }
            why = &mut write_failed => Step::End(LinkEnd::Closed(format!("write failed: {why}"))),
        };
        if let Some(end) = live.after(step, &reader, &quick_ack) {
            break end;
        }
    };
    live.close(&end, &mut reader).await;
    end
}

/// Ready only once requests can be queued (a session attached on this news must be able to
/// send at once); then the registry and the sessions waiting are told.
fn announce_ready(editor: &Arc<Editor>, host: &dyn LinkHost) {
    editor.set_state(LinkState::Ready);
    tracing::info!(editor = %editor.id, port = editor.lockfile().port, restarts = editor.restarts, "editor ready");
    host.state_changed();
    host.editor_ready(editor);
    taken::announce_back(editor, host);
}

/// What a wake-up of the live link asks of its loop.
enum Step {
    /// Nothing more.
    Go,
    /// The wake time may have moved: work it out again.
    Rewake,
    /// A data frame was handled (an ACK may be owed).
    Answered,
    /// The link ends.
    End(LinkEnd),
}

/// The live link's state between wake-ups.
struct Live<'a> {
    editor: &'a Arc<Editor>,
    host: &'a dyn LinkHost,
    /// Pings, pongs and the verdicts they lead to; settings re-read on every tick, so a
    /// reloaded config reaches live links.
    health: Health,
    /// Once cancelled, the link stays up (bounded) until the editor has answered the requests
    /// the broker sent on its own behalf (close_tab for orphaned diffs): closing at once would
    /// reset the connection and the editor could lose those frames unread.
    draining: Option<tokio::time::Instant>,
    /// The close frame owed to the editor when the link ends (RFC 6455 §5.5.1, §7.4): its own
    /// Close echoed, or the code of the framing rule it broke.
    owed_close: Option<u16>,
    /// The wake time is worked out again only after what it depends on may have changed (the
    /// health checks, the earliest deadline, the drain), not on every turn.
    rewake: bool,
    /// On a link taken back for calls: the session-call count last seen and since when it
    /// has not moved with nothing of a session's pending (the hand-back's clock).
    quiet: Option<(u64, tokio::time::Instant)>,
}

impl<'a> Live<'a> {
    /// The link goes live: its writer installed (senders may queue from now on), the editor
    /// announced ready; the reader, the ACK handle and the news of a failed write are the
    /// loop's.
    fn start(
        editor: &'a Arc<Editor>,
        host: &'a dyn LinkHost,
        link: Dialled,
        config: &Config,
    ) -> (Self, LinkReader, crate::quickack::QuickAck, Broken) {
        let Dialled {
            reader,
            writer,
            quick_ack,
            client_port: _,
        } = link;
        let broken = editor.out.install(writer, OUTBOUND_QUEUE, host.tracker());
        editor.flush_parked();
        announce_ready(editor, host);
        let live = Live {
            editor,
            host,
            health: Health::new(config.health.clone(), tokio::time::Instant::now()),
            draining: None,
            owed_close: None,
            rewake: true,
            quiet: None,
        };
        (live, reader, quick_ack, broken)
    }

    /// The timer reset to [`Live::next_wake`], when that may have moved.
    fn rearm(
        &mut self,
        sleep: &mut crate::woken::WhenWoken<std::pin::Pin<&mut tokio::time::Sleep>>,
    ) {
        if std::mem::take(&mut self.rewake) {
            let wake = self.next_wake();
            if sleep.inner().deadline() != wake {
                sleep.inner_mut().as_mut().reset(wake);
            }
        }
    }

    /// What the loop does after a step: the end of the link, if it ends.
    fn after(
        &mut self,
        step: Step,
        reader: &LinkReader,
        quick_ack: &crate::quickack::QuickAck,
    ) -> Option<LinkEnd> {
        match step {
            Step::Go => {}
            Step::Rewake => self.rewake = true,
            // More answers owed: the editor may be holding the next one (Nagle) until what it
            // sent is acknowledged. One ACK covers everything read, so it is sent once the
            // frames already read are handled.
            Step::Answered => {
                if !reader.more_buffered() && !self.editor.pending.is_empty() {
                    quick_ack.now();
                }
            }
            Step::End(end) => return Some(end),
        }
        None
    }

    /// The end of a drain: nothing owed any more, or its time is up.
    fn drained(&self) -> Option<LinkEnd> {
        let until = self.draining?;
        let owed = self
            .editor
            .pending
            .iter()
            .any(|p| matches!(p.owner, Owner::Discard));
        (!owed || tokio::time::Instant::now() >= until).then_some(LinkEnd::Cancelled)
    }

    /// The earliest of the health checks, the first short-tool deadline and the drain's end.
    fn next_wake(&self) -> tokio::time::Instant {
        let mut wake = self.health.next_wake();
        if let Some(at) = self.editor.next_deadline() {
            wake = wake.min(at);
        }
        if let Some(until) = self.draining {
            wake = wake.min(until);
        }
        if let Some((_, since)) = self.quiet {
            wake = wake.min(since + taken::HAND_BACK);
        }
        wake
    }

    /// True once a link taken back for calls has been idle for [`taken::HAND_BACK`]: no
    /// session call pending, and none sent meanwhile.
    fn hand_back_due(&mut self, now: tokio::time::Instant) -> bool {
        if !self.editor.reclaimed.load(Ordering::Acquire) {
            self.quiet = None;
            return false;
        }
        let calls = self.editor.calls.load(Ordering::Relaxed);
        let busy = self
            .editor
            .pending
            .iter()
            .any(|p| matches!(p.owner, Owner::Session { .. }));
        match self.quiet {
            Some((seen, since)) if seen == calls && !busy => now >= since + taken::HAND_BACK,
            _ => {
                self.quiet = Some((calls, now));
                false
            }
        }
    }

    fn start_draining(&mut self) -> Step {
        self.draining = Some(tokio::time::Instant::now() + Duration::from_secs(1));
        Step::Rewake
    }

    /// The timer: expired deadlines answered, then the health checks' actions.
    fn on_tick(&mut self) -> Step {
        let now = tokio::time::Instant::now();
        self.editor.expire_deadlines(now);
        if self.hand_back_due(now) {
            self.owed_close = Some(1000);
            return Step::End(LinkEnd::HandedBack);
        }
        self.health.set_settings(self.host.config().health.clone());
        let mut dropped = None;
        for action in self.health.on_tick(now) {
            match action {
                HealthAction::Ping(payload) => {
                    if self.editor.send_frame(Out::Ping(payload.to_vec())).is_err() {
                        tracing::debug!("ping not sent: the link's queue is full");
                    }
                }
                HealthAction::Unhealthy => {
                    self.editor.set_state(LinkState::Unhealthy);
                    self.host.state_changed();
                    tracing::warn!(editor = %self.editor.id, "editor unhealthy: no pong");
                }
                HealthAction::Drop(why) => dropped = Some(why),
            }
        }
        match dropped {
            Some(why) => Step::End(LinkEnd::Closed(why)),
            None => Step::Rewake,
        }
    }

    /// One frame from the editor (or the end of its stream, or a framing error).
    fn on_frame(&mut self, frame: Result<Option<Frame<'_>>, crate::wsframe::WsError>) -> Step {
        let frame = match frame {
            Ok(Some(f)) => f,
            Ok(None) => return Step::End(LinkEnd::EditorClosed("connection closed".into())),
            Err(e) => {
                self.owed_close = e.close_code();
                return Step::End(LinkEnd::Closed(e.to_string()));
            }
        };
        match frame {
            Frame::Pong(p) => {
                self.on_pong(p);
                return Step::Rewake;
            }
            Frame::Ping(p) => {
                if self.editor.send_frame(Out::Pong(p.to_vec())).is_err() {
                    tracing::debug!("pong not sent: the link's queue is full");
                }
            }
            Frame::Close(c) => {
                self.owed_close = Some(c.unwrap_or(1000));
                let code = c.map_or_else(|| "no code".into(), |c| c.to_string());
                return Step::End(LinkEnd::EditorClosed(format!("closed by editor ({code})")));
            }
            other => {
                // Read in place: the answer's bytes are copied once, into the session's frame.
                if let Some(text) = frame_str(&other) {
                    handle_editor_frame(self.editor, self.host, text);
                }
                return Step::Answered;
            }
        }
        Step::Go
    }

    fn on_pong(&mut self, payload: &[u8]) {
        let pong = self.health.on_pong(payload, tokio::time::Instant::now());
        if let Some(rtt) = pong.rtt {
            let first = lock(&self.editor.link).rtt.replace(rtt).is_none();
            if first {
                self.host.state_changed();
            }
        }
        if pong.recovered {
            self.editor.set_state(LinkState::Ready);
            self.host.state_changed();
            tracing::info!(editor = %self.editor.id, "editor healthy again");
        }
    }

    /// How the link ends: queued frames let out on a cancel; on a close, the closing
    /// handshake, bounded (our Close, then the editor's end of the stream).
    async fn close(&self, end: &LinkEnd, reader: &mut LinkReader) {
        let out = &self.editor.out;
        match (end, self.owed_close) {
            // Let queued frames (e.g. close_tab on shutdown) reach the editor first.
            (LinkEnd::Cancelled, _) => _ = out.finish(None, Duration::from_secs(1)).await,
            (LinkEnd::Closed(_) | LinkEnd::EditorClosed(_) | LinkEnd::HandedBack, Some(code)) => {
                if out.finish(Some(Out::Close(code)), CLOSE_WAIT).await {
                    let _ = tokio::time::timeout(CLOSE_WAIT, async {
                        while let Ok(Some(_)) = reader.next().await {}
                    })
                    .await;
                }
            }
            _ => out.discard(),
        }
    }
}

/// How long a closing link waits for its Close to be written, and then for the editor to
/// close the connection.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// Routes one frame from the editor: answers to their owners, notifications to sessions,
/// editor-initiated requests to one session.
pub fn handle_editor_frame(editor: &Arc<Editor>, host: &dyn LinkHost, text: &str) {
    if fast_reply(editor, text).is_some() {
        return;
    }
    let incoming = match jsonrpc::classify(text) {
        Ok(i) => i,
        Err(r) => {
            tracing::warn!(editor = %editor.id, error = %r.message, "editor sent an invalid message; ignored");
            return;
        }
    };
    match incoming {
        Incoming::Response { id, mut msg } => {
            let Some(p) = id
                .as_u64()
                .and_then(|uid| editor.pending.remove(&uid))
                .map(|(_, p)| p)
            else {
                tracing::debug!(editor = %editor.id, %id, "answer to no pending request (late or cancelled)");
                return;
            };
            if let Some(b) = &p.bridge {
                if let Some(crate::bridge::Followup::CloseTab(tab)) =
                    crate::bridge::inbound(b, &mut msg)
                {
                    let _ = editor.close_tab(&tab);
                }
            }
            if let (Some(m), Some(result)) = (&p.map, msg.get_mut("result")) {
                m.map_result_texts(result, false);
            }
            match p.owner {
                Owner::Session { outbox, id, .. } => {
                    msg.insert("id".into(), id.into_value());
                    outbox.deliver(Value::Object(msg).to_string());
                }
                Owner::Internal(tx) => {
                    let _ = tx.send(msg);
                }
                Owner::Discard => {}
            }
        }
        Incoming::Notification { method, mut msg } => match method.as_str() {
            "selection_changed" => {
                editor.focus.store(host.stamp(), Ordering::Relaxed);
                let text = absolute_paths(editor, &mut msg).unwrap_or_else(|| text.to_string());
                editor.selection.send_replace(Some(Arc::from(text)));
            }
            "at_mentioned" => {
                let text = absolute_paths(editor, &mut msg).unwrap_or_else(|| text.to_string());
                host.broadcast(editor, &text);
            }
            "request_cancelled" => {
                let key = msg
                    .get("params")
                    .and_then(|p| p.get("id"))
                    .map(Value::to_string);
                if let Some((_, d)) = key.and_then(|k| editor.delegated.remove(&k)) {
                    host.cancel_delegated(editor, &d);
                }
            }
            _ => host.broadcast(editor, text),
        },
        // The editor's own liveness check (JetBrains pings every 5 s and drops a client that
        // has not answered within 3 s): answered here by the link, never handed to a session.
        Incoming::Request { id, method, .. } if method == "ping" => {
            let _ = editor.send_raw(jsonrpc::result(&id, json!({})));
        }
        Incoming::Request { id, method, msg } => {
            if !host.delegate(editor, &id, msg) {
                tracing::info!(editor = %editor.id, %method, "editor request with no session attached; answered with an error");
                let _ = editor.send_raw(jsonrpc::error(
                    &id,
                    jsonrpc::SERVER_ERROR,
                    "No agent session is attached to this editor",
                ));
            }
        }
    }
}

/// claudecode sends `at_mentioned` (and could send selections) with `filePath` relative to
/// its cwd, its first workspace folder: made absolute, since a session's cwd differs. Returns
/// the rewritten frame, or `None` when the path was absolute already.
fn absolute_paths(editor: &Editor, msg: &mut Map<String, Value>) -> Option<String> {
    let params = msg.get_mut("params")?.as_object_mut()?;
    let path = params.get("filePath")?.as_str()?;
    if path.is_empty() || path.starts_with('/') {
        return None;
    }
    let base = editor.lockfile().workspace_folders.first()?.clone();
    let mut abs = std::path::PathBuf::from(base)
        .join(path)
        .display()
        .to_string();
    if path.ends_with('/') && !abs.ends_with('/') {
        abs.push('/'); // a directory keeps its trailing slash
    }
    params.insert("filePath".into(), Value::String(abs));
    Some(Value::Object(std::mem::take(msg)).to_string())
}

/// The hot path: an answer for a session of the editor's own dialect goes back with the
/// session's id and the editor's `result`/`error` bytes untouched, without building a tree.
/// `Some(())` when handled, `None` when the slow path must look at it.
fn fast_reply(editor: &Editor, text: &str) -> Option<()> {
    let [id, method, result, error] =
        crate::jsonscan::members(text, ["id", "method", "result", "error"])?;
    if method.is_some() {
        return None;
    }
    let uid = crate::jsonscan::plain_u64(id?)?;
    let (key, body) = match (result, error) {
        (Some(r), None) => ("result", r),
        (None, Some(e)) => ("error", e),
        _ => return None,
    };
    let (_, p) = editor.pending.remove_if(&uid, |_, p| {
        matches!(p.owner, Owner::Session { .. }) && p.bridge.is_none() && p.map.is_none()
    })?;
    if let Owner::Session { outbox, id, .. } = p.owner {
        // The id's JSON text, borrowed where it can be: the answer is written from its parts
        // (the editor's result bytes among them) without being assembled.
        let plain = |s: &str| !s.bytes().any(|c| c == b'"' || c == b'\\' || c < 0x20);
        let mut digits = itoa::Buffer::new();
        let (quote, id_text) = match &id {
            jsonrpc::ClientId::Plain(n) => ("", Cow::Borrowed(digits.format(*n))),
            jsonrpc::ClientId::Json(Value::Number(n)) => ("", Cow::Borrowed(n.as_str())),
            jsonrpc::ClientId::Json(Value::String(s)) if plain(s) => {
                ("\"", Cow::Borrowed(s.as_str()))
            }
            jsonrpc::ClientId::Json(other) => ("", Cow::Owned(other.to_string())),
        };
        const HEAD: &str = "{\"jsonrpc\":\"2.0\",\"id\":";
        outbox.deliver_parts(&[HEAD, quote, &id_text, quote, ",\"", key, "\":", body, "}"]);
    }
    Some(())
}

/// Capped exponential backoff with ±20 % jitter.
struct Backoff {
    initial: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    fn new(config: &Config) -> Self {
        let initial = Duration::from_millis(config.backoff.initial_ms);
        Backoff {
            initial,
            max: Duration::from_millis(config.backoff.max_ms),
            current: initial,
        }
    }

    fn reset(&mut self) {
        self.current = self.initial;
    }

    fn next(&mut self) -> Duration {
        let base = self.current;
        self.current = (self.current * 2).min(self.max);
        let mut b = [0u8; 2];
        let r = getrandom::fill(&mut b)
            .map(|_| u16::from_le_bytes(b))
            .unwrap_or(32768);
        // factor in [0.8, 1.2]
        let factor = 0.8 + 0.4 * (f64::from(r) / f64::from(u16::MAX));
        base.mul_f64(factor)
    }
}

/// The largest id the broker mints: ids stay exact as the doubles Lua and JavaScript editors
/// read them as (2^53 - 1), and start again at 1 after it.
const MAX_MINTED_ID: u64 = (1 << 53) - 1;

/// The next id from `counter`: 1, 2, … up to [`MAX_MINTED_ID`], then 1 again.
fn mint_id(counter: &AtomicU64) -> u64 {
    let wrap = |id: u64| if id >= MAX_MINTED_ID { 1 } else { id + 1 };
    match counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |id| Some(wrap(id))) {
        Ok(id) | Err(id) => id.clamp(1, MAX_MINTED_ID),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_ids_stay_below_2_pow_53_and_start_again_at_1() {
        let counter = AtomicU64::new(1);
        assert_eq!((mint_id(&counter), mint_id(&counter)), (1, 2));
        let counter = AtomicU64::new(MAX_MINTED_ID - 1);
        let ids: Vec<u64> = (0..4).map(|_| mint_id(&counter)).collect();
        assert_eq!(ids, vec![MAX_MINTED_ID - 1, MAX_MINTED_ID, 1, 2]);
        assert!(
            ids.iter().all(|id| (*id as f64) as u64 == *id),
            "exact as doubles"
        );
    }

    #[test]
    fn backoff_grows_to_the_cap_with_jitter() {
        let mut c = Config::default();
        c.backoff.initial_ms = 100;
        c.backoff.max_ms = 1000;
        let mut b = Backoff::new(&c);
        let delays: Vec<Duration> = (0..8).map(|_| b.next()).collect();
        assert!(delays[0] >= Duration::from_millis(80) && delays[0] <= Duration::from_millis(120));
        assert!(delays[3] >= Duration::from_millis(640));
        for d in &delays {
            assert!(*d <= Duration::from_millis(1200));
        }
        b.reset();
        assert!(b.next() <= Duration::from_millis(120));
    }

    fn test_editor() -> Editor {
        let lock = Lockfile {
            path: PathBuf::from("/nonexistent/1.lock"),
            family: crate::family::Family::Pi,
            port: 1,
            pid: 1,
            workspace_folders: Vec::new(),
            ide_name: "test".into(),
            auth_token: Some(crate::secret::Token::new("t".into())),
        };
        Editor::new(
            "test".into(),
            lock,
            Vec::new(),
            Succession::default(),
            CancellationToken::new(),
        )
    }

    /// A short call in flight under `uid` until `at`.
    fn in_flight(editor: &Editor, uid: u64, at: tokio::time::Instant) {
        editor.pending.insert(
            uid,
            Pending {
                owner: Owner::Discard,
                method: "tools/call".into(),
                tool: Some("getDiagnostics".into()),
                tab_name: None,
                started: Instant::now(),
                deadline: Some(at),
                bridge: None,
                map: None,
            },
        );
        lock(&editor.deadlines).push(Reverse((at, uid)));
    }

    #[test]
    fn the_deadline_sweep_wakes_only_for_calls_still_owed() {
        let editor = test_editor();
        let t0 = tokio::time::Instant::now();
        let s = Duration::from_secs;
        in_flight(&editor, 1, t0 + s(5));
        in_flight(&editor, 2, t0 + s(6));
        in_flight(&editor, 3, t0 + s(7));
        // 1 and 2 are answered; nothing is due yet.
        editor.pending.remove(&1);
        editor.pending.remove(&2);
        editor.expire_deadlines(t0);
        assert_eq!(
            editor.next_deadline(),
            Some(t0 + s(7)),
            "the next wake-up is the earliest call still owed, not an answered one's"
        );
        assert!(editor.pending.contains_key(&3), "3 is not due");
        // 3 is due: it times out and leaves the table; nothing is left to wake for.
        editor.expire_deadlines(t0 + s(7));
        assert!(!editor.pending.contains_key(&3));
        assert_eq!(editor.next_deadline(), None);
    }
}
