//! `Editor`, the handle every session and the registry share: pending calls, deadlines, sends.
//!
//! `Editor`: the handle every session and the registry share: the lockfile, link state, the
//! pending table with its deadlines, minted ids, cached selection and tools, the `send_*` methods.

use super::journal::{DiffJournal, EditorKey};
use super::lockfile::Lockfile;
use super::parked::Parked;
use super::Error;
use crate::platform::sync::lock;
use crate::protocol::family::Family;
use crate::protocol::jsonrpc::{self};
use crate::wire::outbox::Outbox;
use crate::wire::shared_writer::{Refused, SharedWriter};
use crate::wire::wsframe::{FrameReader, FrameWriter, Out};
use dashmap::DashMap;

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
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;

/// The read half of a link, as the link task reads it.
pub(super) type LinkReader = FrameReader<OwnedReadHalf>;
/// The write half of a link, behind the handle's `SharedWriter`.
pub(super) type LinkSink = FrameWriter<OwnedWriteHalf>;

/// How many frames may queue for one editor's socket before callers get "busy".
pub(super) const OUTBOUND_QUEUE: usize = 4096;

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
    /// How to rewrite the answer for a session of the other family (`None`: pass through).
    pub bridge: Option<crate::protocol::bridge::Bridge>,
    /// A remote session's path map: paths in the answer go back as the agent sees them.
    pub map: Option<Arc<crate::protocol::pathmap::PathMap>>,
}

impl Pending {
    /// The tab name the editor knows this diff by (a marked name on a bridged diff).
    pub fn editor_tab(&self) -> Option<&str> {
        match &self.bridge {
            Some(crate::protocol::bridge::Bridge::DiffOnClaude { editor_tab, .. }) => {
                Some(editor_tab)
            }
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
    pub(super) lock: Mutex<Lockfile>,
    /// Workspace folders, normalised for routing.
    pub folders: Vec<PathBuf>,
    /// A Windows editor seen from WSL: every frame on its link has its paths mapped, WSL's
    /// form inside the broker, Windows' on the wire (see `protocol::winpath`).
    pub wsl: Option<crate::protocol::winpath::Wsl>,
    /// How many times this editor restarted (successor chain length).
    pub restarts: u32,
    /// The port of the editor this one replaced, if any.
    pub previous_port: Option<u16>,
    /// The pid of the editor this one replaced, if any (shown so a user sees why sessions
    /// followed it).
    pub previous_pid: Option<u32>,
    /// Link state for status and routing.
    pub(super) link: Mutex<LinkInfo>,
    /// The write half of the live link; empty while down.
    pub(super) out: SharedWriter<LinkSink, Out>,
    /// Requests in flight, by the id the broker minted (private: the invariants of the
    /// pending table live in this module's methods).
    pub(super) pending: DashMap<u64, Pending, rustc_hash::FxBuildHasher>,
    /// Deadlines of the short tools in flight, earliest first: one sweep per link, no timer
    /// task per request.
    pub(super) deadlines: Mutex<BinaryHeap<Reverse<(tokio::time::Instant, u64)>>>,
    /// Woken when a new deadline may be the earliest.
    pub(super) deadline_added: tokio::sync::Notify,
    /// The next id to mint (numbers below 2^53, safe for Lua doubles).
    pub(super) next_id: AtomicU64,
    /// The latest `selection_changed` frame: coalesces for slow sessions and replays on attach.
    pub(super) selection: watch::Sender<Option<Arc<str>>>,
    /// Activity stamp (from `LinkHost::stamp`, not a time) of the last `selection_changed`
    /// (0 = never): the editor the user touched last has the highest.
    pub(super) focus: AtomicU64,
    /// Editor-initiated requests handed to a session, by the editor's id (as JSON text).
    pub(super) delegated: DashMap<String, Delegation>,
    /// Cancelled when the editor is gone; stops the link task.
    pub(super) cancel: CancellationToken,
    /// Woken by a call to a `taken` editor: a session needs it, so the link is dialled again.
    pub(super) wanted: tokio::sync::Notify,
    /// Calls made while another client holds the editor, waiting for the link dialled for
    /// them (see `taken`).
    pub(super) parked: Mutex<Vec<Parked>>,
    /// Parked calls written on the current (or coming) link, kept until it ends: one cut by
    /// the editor's close before its answer came may be sent once more (see `taken`).
    pub(super) sent: Mutex<Vec<Parked>>,
    /// The current (or coming) link was dialled for calls while another client held the
    /// editor: it is handed back once idle.
    pub(super) reclaimed: std::sync::atomic::AtomicBool,
    /// Session calls sent, ever (the hand-back waits until it stops moving).
    pub(super) calls: AtomicU64,
    /// The diffs open in editors, the daemon's one journal (see `journal`).
    pub(super) diffs: Arc<DiffJournal>,
}

impl Editor {
    /// A new handle for a validated lockfile; the link task is started separately.
    pub fn new(
        id: String,
        lock: Lockfile,
        folders: Vec<PathBuf>,
        succession: Succession,
        cancel: CancellationToken,
        diffs: Arc<DiffJournal>,
    ) -> Self {
        Editor {
            id,
            family: lock.family,
            wsl: lock.wsl.clone(),
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
            diffs,
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
    ) -> Result<u64, Error> {
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
    ) -> Result<u64, Error> {
        let uid = mint_id(&self.next_id);
        let text = self.to_wire(build(uid));
        let deadline = pending.deadline;
        // Journalled before it can reach the editor (a crash after the send leaves it known).
        let diff = pending.editor_tab().map(str::to_string);
        if let Some(tab) = &diff {
            self.diffs.opened(self.key(), tab);
        }
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
            if let Some(tab) = &diff {
                self.diffs.closed(self.key(), tab);
            }
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

    /// How many calls wait for this editor's answer (every session's, and the broker's own).
    pub fn pending_calls(&self) -> usize {
        self.pending.len()
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
    pub(super) fn next_deadline(&self) -> Option<tokio::time::Instant> {
        lock(&self.deadlines).peek().map(|Reverse((at, _))| *at)
    }

    /// Answers every short tool whose deadline has passed with a timeout error (the answer,
    /// if the editor sends one later, is dropped as late). Also drops the deadlines of calls
    /// already answered from the front, so the next wake-up is the earliest call still owed:
    /// otherwise every answered call would wake the link once more when its deadline passed.
    pub(super) fn expire_deadlines(&self, now: tokio::time::Instant) {
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
    pub fn send_discard(&self, method: &'static str, params: Value) -> Result<u64, Error> {
        let mut msg = Map::new();
        msg.insert("jsonrpc".into(), "2.0".into());
        msg.insert("method".into(), method.into());
        msg.insert("params".into(), params);
        let tool = msg
            .get("params")
            .and_then(|p| p.get("name"))
            .and_then(Value::as_str)
            .map(crate::protocol::family::tool_label);
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
    pub fn close_tab(&self, tab: &str) -> Result<u64, Error> {
        let args = json!({"name": "close_tab", "arguments": {"tab_name": tab}});
        let sent = self.send_discard("tools/call", args)?;
        self.diffs.closed(self.key(), tab); // sent: it is closed for the journal
        Ok(sent)
    }

    /// The editor process, as the journal of open diffs knows it.
    pub(super) fn key(&self) -> EditorKey {
        let l = lock(&self.lock);
        EditorKey::new(l.port, l.pid)
    }

    /// A diff this editor answered: closed there (claudecode's accepted one: by its session).
    pub(super) fn diff_answered(&self, p: &Pending) {
        if let Some(tab) = p.editor_tab() {
            self.diffs.closed(self.key(), tab);
        }
    }

    /// Sends a frame that needs no answer (notification, or a response to the editor).
    pub fn send_raw(&self, text: String) -> Result<(), Error> {
        self.send_frame(Out::Text(text))
    }

    /// Puts one frame on the link: written now by the calling task when the link is idle,
    /// else queued for its writer task (see `shared_writer`).
    pub(super) fn send_frame(&self, frame: Out) -> Result<(), Error> {
        let frame = match frame {
            Out::Text(text) if self.wsl.is_some() => Out::Text(self.to_wire(text)),
            other => other,
        };
        self.out.send(frame).map_err(|r| self.refusal(r))
    }

    /// A frame for the editor with its paths as the editor writes them (WSL → Windows for a
    /// Windows editor seen from WSL; unchanged for every other).
    fn to_wire(&self, text: String) -> String {
        match &self.wsl {
            Some(w) => w.frame(&text, false),
            None => text,
        }
    }

    /// Why a frame was refused, for the caller.
    pub(super) fn refusal(&self, r: Refused) -> Error {
        match r {
            Refused::Full => Error::Busy(self.id.clone()),
            Refused::Broken => Error::Down(self.id.clone(), "closing"),
            // Read only on this path: a send that goes through takes no other lock.
            Refused::Gone => Error::Down(
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
    pub(super) fn undelivered(&self, p: Pending, why: &str) {
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

/// The largest id the broker mints: ids stay exact as the doubles Lua and JavaScript editors
/// read them as (2^53 - 1), and start again at 1 after it.
pub(super) const MAX_MINTED_ID: u64 = (1 << 53) - 1;

/// The next id from `counter`: 1, 2, … up to [`MAX_MINTED_ID`], then 1 again.
pub(super) fn mint_id(counter: &AtomicU64) -> u64 {
    let wrap = |id: u64| if id >= MAX_MINTED_ID { 1 } else { id + 1 };
    match counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |id| Some(wrap(id))) {
        Ok(id) | Err(id) => id.clamp(1, MAX_MINTED_ID),
    }
}

/// The tools a call of which, cut by the editor's close before any answer came, is sent once
/// more: they only read the editor's state, so a call the editor did run is harmless run
/// twice. Anything else is sent once: an `openDiff` must never be shown twice (a cut one is
/// answered `DIFF_REJECTED`, marked undelivered), `executeCode` must not run twice, and an
/// `openFile` or `saveDocument` may have happened.
const RESENDABLE: &[&str] = &[
    "getDiagnostics",
    "getOpenEditors",
    "getOpenEditorTabs",
    "getWorkspaceFolders",
    "getCurrentSelection",
    "getLatestSelection",
    "checkDocumentDirty",
    "get_all_opened_file_paths",
];

impl Pending {
    /// True for a session's call that may be sent again after a cut (see [`RESENDABLE`]).
    pub(super) fn resendable(&self) -> bool {
        matches!(self.owner, Owner::Session { .. })
            && !self.is_diff()
            && self.method == "tools/call"
            && self
                .tool
                .as_deref()
                .is_some_and(|t| RESENDABLE.contains(&t))
    }
}

#[cfg(test)]
mod tests;
