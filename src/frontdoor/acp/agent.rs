//! The ACP agent's state, without I/O: what each client line or broker frame makes.
//!
//! The client is the editor (Zed, CodeCompanion, agentic.nvim) speaking ACP v1; each ACP
//! session follows one pi session through the broker (`session::follow`). `mod.rs` does the
//! I/O: it reads lines, performs the [`Out`]s and feeds the results back.

use super::messages::{
    cancel_request, initialize_result, invalid, ready, say, session_update, to_pi, turn_ended,
};
pub use super::messages::{Out, Purpose};
use super::prompt::{fresh_blocks, prompt_parts};
use crate::protocol::acp::{self, method, ContentBlock, SessionUpdate, StopReason};
use crate::protocol::follow::{Ended, Notice as _, PiSession, ReadBuffer};
use crate::protocol::jsonrpc::{self, follow, Incoming};
use serde_json::{json, Map, Value};
use std::collections::HashMap;

/// ACP's "internal error": -32000 is ACP's "authentication required", which a client answers
/// with an auth flow, so the broker's own -32000 is never used here.
pub(super) const INTERNAL_ERROR: i64 = -32603;
/// ACP's "resource not found": no pi session to follow.
pub(super) const RESOURCE_NOT_FOUND: i64 = -32002;

/// Why a follow connection did not open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unfollowed {
    /// The broker has no followable pi session of that key (ACP's "resource not found").
    NotFound(String),
    /// Anything else (no daemon, a refusal, a timeout), in words for the user.
    Failed(String),
}

/// The prompt that opens a turn only to watch: it is not sent to pi, and ends on
/// `session/cancel`. A client that shows updates only inside a turn (CodeCompanion,
/// agent-shell, JetBrains) shows pi's terminal activity and asks its reviews in it.
pub(super) const FOLLOW_WORDS: [&str; 2] = ["follow", "/follow"];

/// A turn the client has open (its `session/prompt` is not answered yet).
#[derive(Debug)]
struct Turn {
    /// The client's prompt id.
    id: Value,
    /// Our `pi/prompt` id, which `pi/cancel` names; `None` for a watching turn (`follow`):
    /// nothing was sent to pi.
    asked: Option<String>,
    /// `session/cancel` came: the turn's answer says `cancelled`.
    cancelled: bool,
    /// The prompt's blocks as the client sent them: what it re-sends if it is cancelled.
    blocks: Vec<ContentBlock>,
}

/// What a request of ours to the broker is waiting for.
#[derive(Debug)]
enum BrokerWait {
    /// `pi/history` for `session/load` (the client's request id).
    History(Value),
    /// `pi/prompt`: ends the open turn.
    Prompt,
    /// `pi/cancel`: nothing to do with its answer.
    Cancel,
}

/// One followed pi session.
#[derive(Debug, Default)]
struct Followed {
    turn: Option<Turn>,
    waits: HashMap<String, BrokerWait>,
    /// The blocks of this thread's last prompt the client cancelled, until its next prompt: a
    /// client that re-sends unfinished messages with the next one (CodeCompanion) has them
    /// dropped instead of run again ([`fresh_blocks`] has the rule).
    resent: Vec<ContentBlock>,
    /// The text of this thread's prompt while its turn is open: pi mirrors it back to every
    /// follower as a user message, and this thread, which shows it already, drops its echo.
    echo: Option<String>,
}

/// A permission request of ours to the client, for a review the broker asked.
#[derive(Debug)]
struct Review {
    session: String,
    /// The broker's `pi/review` id.
    broker_id: Value,
    new_text: String,
    tab: String,
}

/// The agent.
#[derive(Debug, Default)]
pub struct Agent {
    /// The client's capabilities, as `initialize` gave them.
    pub client_capabilities: acp::ClientCapabilities,
    /// The client's name (`clientInfo.name`), for `status`.
    pub client_name: Option<String>,
    sessions: HashMap<String, Followed>,
    reviews: HashMap<String, Review>,
    /// Buffer reads asked of the client: our id → (ACP session, the broker's `pi/read` id).
    reads: HashMap<String, (String, Value)>,
    /// The folder of each ACP session, as listed or loaded: its title.
    cwds: HashMap<String, String>,
    /// When this door last relayed an update of each pi session: its `updatedAt` in
    /// `session/list` when later than the session's start.
    seen: HashMap<String, std::time::SystemTime>,
    next_id: u64,
}

impl Agent {
    fn mint(&mut self, prefix: &str) -> String {
        self.next_id += 1;
        format!("{prefix}-{}", self.next_id)
    }

    /// One line from the client.
    pub fn on_client_line(&mut self, line: &str) -> Vec<Out> {
        match jsonrpc::classify(line) {
            Err(r) => vec![Out::Client(jsonrpc::rejection(&r))],
            Ok(Incoming::Request { id, method, msg }) => self.request(id, &method, &msg),
            Ok(Incoming::Notification { method, msg }) => match method.as_str() {
                method::SESSION_CANCEL => match acp::params::<acp::SessionRef>(&msg) {
                    Some(r) => self.cancel(&r.session_id),
                    None => Vec::new(),
                },
                // ACP v1's per-request cancel: one naming an open prompt is that prompt's
                // `session/cancel` (its answer says `cancelled`, the spec's cancellation marker).
                method::CANCEL_REQUEST => {
                    match msg.get("params").and_then(|p| p.get("requestId")) {
                        Some(asked) => self.cancel_prompt(asked),
                        None => Vec::new(),
                    }
                }
                _ => Vec::new(),
            },
            Ok(Incoming::Response { id, msg }) => self.permission_answered(&id, &msg),
        }
    }

    fn request(&mut self, id: Value, name: &str, msg: &Map<String, Value>) -> Vec<Out> {
        match name {
            method::INITIALIZE => {
                let init: acp::InitializeRequest = acp::params(msg).unwrap_or_default();
                self.client_capabilities = init.client_capabilities;
                self.client_name = init.client_info.map(|c| c.name);
                vec![Out::Client(jsonrpc::result(&id, initialize_result()))]
            }
            method::AUTHENTICATE => vec![Out::Client(jsonrpc::result(&id, json!({})))],
            method::SESSION_NEW => match acp::params::<acp::InFolder>(msg).and_then(|p| p.cwd) {
                Some(cwd) if crate::protocol::winpath::is_absolute(&cwd) => vec![Out::List {
                    cwd,
                    purpose: Purpose::New(id),
                }],
                _ => vec![invalid(&id, "session/new needs an absolute cwd")],
            },
            method::SESSION_LOAD | method::SESSION_RESUME => {
                match acp::params::<acp::SessionRef>(msg) {
                    Some(acp::SessionRef {
                        session_id: key,
                        cwd,
                    }) => {
                        if let Some(cwd) = cwd {
                            self.cwds.insert(key.clone(), cwd);
                        }
                        let mut out = self.unfollow(&key);
                        out.push(Out::Connect {
                            key,
                            request: id,
                            load: name == method::SESSION_LOAD,
                        });
                        out
                    }
                    None => vec![invalid(&id, &format!("{name} needs a sessionId"))],
                }
            }
            method::SESSION_CLOSE => match acp::params::<acp::SessionRef>(msg) {
                Some(r) if self.sessions.contains_key(&r.session_id) => {
                    let mut out = self.unfollow(&r.session_id);
                    out.push(Out::Client(jsonrpc::result(&id, json!({}))));
                    out
                }
                Some(r) => vec![Out::Client(jsonrpc::error(
                    &id,
                    RESOURCE_NOT_FOUND,
                    &format!("no open session {:?}", r.session_id),
                ))],
                None => vec![invalid(&id, "session/close needs a sessionId")],
            },
            method::SESSION_LIST => {
                let asked: acp::ListSessionsRequest = acp::params(msg).unwrap_or_default();
                if let Some(cursor) = asked.cursor {
                    // Every session is in the first page: no cursor was ever handed out.
                    return vec![invalid(
                        &id,
                        &format!("unknown cursor {cursor:?}: session/list answers in one page and hands out no cursor"),
                    )];
                }
                vec![Out::List {
                    cwd: asked.cwd.clone().unwrap_or_else(|| "/".to_string()),
                    purpose: Purpose::List { id, cwd: asked.cwd },
                }]
            }
            method::SESSION_PROMPT => match acp::params::<acp::PromptRequest>(msg) {
                Some(p) => self.prompt(id, p),
                None => vec![invalid(&id, "session/prompt needs a sessionId")],
            },
            _ => vec![Out::Client(jsonrpc::error(
                &id,
                jsonrpc::METHOD_NOT_FOUND,
                &format!("pi-ide-broker acp does not offer {name}"),
            ))],
        }
    }

    /// The followable sessions, listed for `purpose`.
    pub fn listed(&mut self, purpose: Purpose, found: Result<Vec<PiSession>, String>) -> Vec<Out> {
        match (purpose, found) {
            (Purpose::New(id) | Purpose::List { id, .. }, Err(why)) => {
                vec![Out::Client(jsonrpc::error(&id, INTERNAL_ERROR, &why))]
            }
            (Purpose::New(id), Ok(list)) => {
                match list.first().and_then(|s| Some((s.session.clone()?, s.cwd.clone()))) {
                    Some((key, cwd)) => {
                        self.cwds.insert(key.clone(), cwd);
                        let mut out = self.unfollow(&key);
                        out.push(Out::Connect {
                            key,
                            request: id,
                            load: false,
                        });
                        out
                    }
                    None => vec![Out::Client(jsonrpc::error(
                        &id,
                        RESOURCE_NOT_FOUND,
                        "no pi session runs in this folder with the pi-ide-broker extension: start `pi` there (`pi-ide-broker setup` installs the extension), then open a new thread",
                    ))],
                }
            }
            (Purpose::List { id, cwd }, Ok(list)) => {
                // The broker lists the folder and those inside it (what `session/new` may
                // follow); ACP's filter is the session's cwd itself.
                let wanted = |s: &PiSession| {
                    cwd.as_deref()
                        .is_none_or(|c| std::path::Path::new(&s.cwd) == std::path::Path::new(c))
                };
                let sessions = list
                    .into_iter()
                    .filter(wanted)
                    .filter_map(|s| {
                        let key = s.session?;
                        let started =
                            std::time::UNIX_EPOCH + std::time::Duration::from_secs(s.since);
                        let active = self.seen.get(&key).copied().filter(|t| *t > started);
                        Some(acp::SessionInfo {
                            title: format!("pi in {}", s.cwd),
                            updated_at: crate::sys::time::rfc3339(active.unwrap_or(started)),
                            session_id: key,
                            cwd: s.cwd,
                        })
                    })
                    .collect();
                let answer = acp::to_value(&acp::ListSessionsResponse { sessions });
                vec![Out::Client(jsonrpc::result(&id, answer))]
            }
        }
    }

    /// The follow connection for `key` is open (or could not be): the client's request is
    /// answered, after the history for a load.
    pub fn connected(
        &mut self,
        key: &str,
        request: Value,
        load: bool,
        ok: Result<(), Unfollowed>,
    ) -> Vec<Out> {
        match ok {
            Ok(()) => {}
            Err(Unfollowed::NotFound(why)) => {
                return vec![Out::Client(jsonrpc::error(
                    &request,
                    RESOURCE_NOT_FOUND,
                    &why,
                ))]
            }
            Err(Unfollowed::Failed(why)) => {
                return vec![Out::Client(jsonrpc::error(&request, INTERNAL_ERROR, &why))]
            }
        }
        self.sessions.insert(key.to_string(), Followed::default());
        let info = self.info_update(key, true);
        if !load {
            let answer = acp::NewSessionResponse {
                session_id: key.to_string(),
            };
            let answer = jsonrpc::result(&request, acp::to_value(&answer));
            return vec![Out::Client(answer), info];
        }
        let ours = self.mint("history");
        if let Some(f) = self.sessions.get_mut(key) {
            f.waits.insert(ours.clone(), BrokerWait::History(request));
        }
        vec![info, to_pi(key, ours, follow::HISTORY, json!({}))]
    }

    fn prompt(&mut self, id: Value, request: acp::PromptRequest) -> Vec<Out> {
        let key = request.session_id;
        let ours = self.mint("prompt");
        let Some(f) = self.sessions.get_mut(&key) else {
            return vec![invalid(
                &id,
                &format!("no session {key:?}: open one with session/new"),
            )];
        };
        let resent = std::mem::take(&mut f.resent);
        let (parts, unsent) = prompt_parts(fresh_blocks(&request.prompt, &resent));
        if parts.is_empty() {
            let why = if unsent.is_empty() {
                "empty prompt: type a message (or `follow` to watch pi)".to_string()
            } else {
                format!(
                    "pi-ide-broker acp carries text and file links only; this prompt held only: {}",
                    unsent.join(", ")
                )
            };
            return vec![invalid(&id, &why)];
        }
        let text = parts.join(" ");
        let mut out = Vec::new();
        // A client sends no second prompt while one is open; one that does ends the first.
        if let Some(old) = f.turn.take() {
            out.push(turn_ended(&old.id, StopReason::Cancelled));
        }
        let watching = FOLLOW_WORDS.contains(&text.trim().to_lowercase().as_str());
        f.turn = Some(Turn {
            id,
            asked: (!watching).then(|| ours.clone()),
            cancelled: false,
            blocks: request.prompt,
        });
        out.push(ready(&key, true));
        if !unsent.is_empty() {
            let note = format!(
                "(pi-ide-broker: not sent to pi: {}; only text and file links are carried)",
                unsent.join(", ")
            );
            out.push(say(&key, &note));
        }
        if !watching {
            f.echo = Some(text.clone());
            f.waits.insert(ours.clone(), BrokerWait::Prompt);
            let asked = crate::protocol::follow::PromptParams { text, prompt: None };
            out.push(to_pi(
                &key,
                ours,
                follow::PROMPT,
                crate::protocol::follow::to_params(&asked),
            ));
        }
        out
    }

    /// `session/cancel` for ACP session `key`: every permission it holds is answered to the
    /// broker as rejected and withdrawn from the client, whatever the turn (a watching turn's
    /// permissions are pi's own turn's writes, which wait for them); a watching turn ends
    /// now; pi is asked to stop the prompt turn's own prompt (queued, it is dropped; running,
    /// aborted), whose answer then ends the turn `cancelled`.
    fn cancel(&mut self, key: &str) -> Vec<Out> {
        if !self.sessions.contains_key(key) {
            return Vec::new();
        }
        // ACP: "the client MUST answer pending permissions with `cancelled`"; agentic.nvim does
        // not, and pi's turn cannot end while its write waits for a verdict. The door answers
        // them itself, rejected, before pi is told to stop; a late answer finds nothing.
        let mut out = self.withdraw_reviews(key);
        let ours = self.mint("cancel");
        let Some(f) = self.sessions.get_mut(key) else {
            return out;
        };
        let Some(turn) = f.turn.as_mut() else {
            return out;
        };
        if !turn.cancelled {
            f.resent = turn.blocks.clone();
        }
        match turn.asked.clone() {
            None => {
                let id = turn.id.clone();
                f.turn = None;
                out.push(ready(key, false));
                out.push(turn_ended(&id, StopReason::Cancelled));
            }
            Some(_) if turn.cancelled => {}
            Some(asked) => {
                turn.cancelled = true;
                f.waits.insert(ours.clone(), BrokerWait::Cancel);
                let cancel = crate::protocol::follow::CancelParams {
                    prompt: Some(asked),
                };
                out.push(to_pi(
                    key,
                    ours,
                    follow::CANCEL,
                    crate::protocol::follow::to_params(&cancel),
                ));
            }
        }
        out
    }

    /// The client's `$/cancel_request` for its request `asked`: one naming an open prompt is
    /// that session's `session/cancel`. The door's other answers wait on the broker for
    /// seconds at most (a list, a dial, a history), and are not cancelled.
    fn cancel_prompt(&mut self, asked: &Value) -> Vec<Out> {
        let key = self
            .sessions
            .iter()
            .find(|(_, f)| f.turn.as_ref().is_some_and(|t| t.id == *asked))
            .map(|(k, _)| k.clone());
        match key {
            Some(key) => self.cancel(&key),
            None => Vec::new(),
        }
    }

    /// Takes the pending permissions of ACP session `key` (only the one asking the broker's
    /// `broker_id`, when given) out of the book: our ids and what they asked.
    fn take_reviews(&mut self, key: &str, broker_id: Option<&Value>) -> Vec<(String, Review)> {
        let ids: Vec<String> = self
            .reviews
            .iter()
            .filter(|(_, r)| r.session == key && broker_id.is_none_or(|b| *b == r.broker_id))
            .map(|(id, _)| id.clone())
            .collect();
        ids.into_iter()
            .filter_map(|id| self.reviews.remove(&id).map(|r| (id, r)))
            .collect()
    }

    /// The pending permissions of ACP session `key`, answered to the broker as rejected and
    /// withdrawn from the client.
    fn withdraw_reviews(&mut self, key: &str) -> Vec<Out> {
        let mut out = Vec::new();
        for (id, r) in self.take_reviews(key, None) {
            let rejected = jsonrpc::diff_rejected(&r.tab);
            out.push(Out::Broker(
                r.session,
                jsonrpc::result(&r.broker_id, rejected),
            ));
            out.push(cancel_request(&id));
        }
        out
    }

    /// One frame from the broker on `key`'s follow connection.
    pub fn on_broker_frame(&mut self, key: &str, text: &str) -> Vec<Out> {
        match jsonrpc::classify(text) {
            Err(_) => Vec::new(),
            Ok(Incoming::Notification { method, msg }) => match method.as_str() {
                follow::UPDATE => match msg.get("params").and_then(|p| p.get("update")) {
                    Some(update) if self.is_echo(key, update) => Vec::new(),
                    Some(update) => {
                        let now = std::time::SystemTime::now();
                        match self.seen.get_mut(key) {
                            Some(at) => *at = now,
                            None => _ = self.seen.insert(key.to_string(), now),
                        }
                        vec![session_update(key, SessionUpdate::Relayed(update.clone()))]
                    }
                    None => Vec::new(),
                },
                follow::ENDED => {
                    let why =
                        Ended::from_message(&msg).map_or_else(|| "ended".into(), |e| e.reason);
                    self.ended(key, &why)
                }
                jsonrpc::CANCELLED => {
                    // The broker took back its `pi/review`: the permission asking it goes.
                    match msg.get("params").and_then(|p| p.get("requestId")) {
                        Some(id) => self
                            .take_reviews(key, Some(id))
                            .iter()
                            .map(|(ours, _)| cancel_request(ours))
                            .collect(),
                        None => Vec::new(),
                    }
                }
                _ => Vec::new(),
            },
            Ok(Incoming::Request { id, method, msg }) if method == follow::REVIEW => {
                self.review(key, id, msg.get("params"))
            }
            Ok(Incoming::Request { id, method, msg }) if method == follow::READ_BUFFER => {
                let path = crate::protocol::follow::params::<ReadBuffer>(msg.get("params"))
                    .map(|r| r.path)
                    .unwrap_or_default();
                let ours = self.mint("fsread");
                self.reads.insert(ours.clone(), (key.to_string(), id));
                let read = acp::ReadTextFileRequest {
                    session_id: key.to_string(),
                    path,
                };
                vec![Out::Client(jsonrpc::request(
                    &Value::String(ours),
                    method::READ_TEXT_FILE,
                    acp::to_value(&read),
                ))]
            }
            Ok(Incoming::Request { id, .. }) => vec![Out::Broker(
                key.to_string(),
                jsonrpc::error(
                    &id,
                    jsonrpc::METHOD_NOT_FOUND,
                    "not offered by pi-ide-broker acp",
                ),
            )],
            Ok(Incoming::Response { id, msg }) => self.broker_answered(key, &id, &msg),
        }
    }

    /// ACP's `session_info_update` for `key`: its last activity (now), and its title ("pi in
    /// <folder>") when `titled`.
    fn info_update(&self, key: &str, titled: bool) -> Out {
        let update = acp::OwnUpdate::SessionInfoUpdate {
            title: self
                .cwds
                .get(key)
                .filter(|_| titled)
                .map(|cwd| format!("pi in {cwd}")),
            updated_at: crate::sys::time::rfc3339(std::time::SystemTime::now()),
        };
        session_update(key, SessionUpdate::Own(update))
    }

    /// Whether `update` is pi mirroring this thread's own prompt back (once).
    fn is_echo(&mut self, key: &str, update: &Value) -> bool {
        let Some(f) = self.sessions.get_mut(key) else {
            return false;
        };
        let echoed = update.get("sessionUpdate").and_then(Value::as_str)
            == Some("user_message_chunk")
            && f.echo.as_deref() == update.pointer("/content/text").and_then(Value::as_str);
        if echoed {
            f.echo = None;
        }
        echoed
    }

    fn broker_answered(&mut self, key: &str, id: &Value, msg: &Map<String, Value>) -> Vec<Out> {
        let Some(f) = self.sessions.get_mut(key) else {
            return Vec::new();
        };
        let Some(wait) = id.as_str().and_then(|k| f.waits.remove(k)) else {
            return Vec::new();
        };
        match wait {
            BrokerWait::Cancel => Vec::new(),
            BrokerWait::History(request) => {
                let mut out: Vec<Out> = msg
                    .get("result")
                    .and_then(|r| r.get("updates"))
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .map(|u| session_update(key, SessionUpdate::Relayed(u.clone())))
                    .collect();
                out.push(Out::Client(match msg.get("error") {
                    Some(e) => jsonrpc::error(&request, INTERNAL_ERROR, &error_text(e)),
                    None => jsonrpc::result(&request, json!({})),
                }));
                out
            }
            BrokerWait::Prompt => {
                f.echo = None;
                let Some(turn) = f.turn.take() else {
                    return Vec::new();
                };
                let stop = if turn.cancelled {
                    StopReason::Cancelled
                } else {
                    StopReason::read(msg.get("result").and_then(|r| r.get("stopReason")))
                };
                let answer = match msg.get("error") {
                    Some(e) if !turn.cancelled => {
                        Out::Client(jsonrpc::error(&turn.id, INTERNAL_ERROR, &error_text(e)))
                    }
                    _ => turn_ended(&turn.id, stop),
                };
                vec![ready(key, false), answer, self.info_update(key, false)]
            }
        }
    }

    /// Whether the client offered `fs.readTextFile` (its buffers can be read).
    pub fn reads_buffers(&self) -> bool {
        self.client_capabilities.fs.read_text_file
    }

    /// The followed pi session ended (or its connection could not be kept): an open turn ends,
    /// saying so, and the ACP session is forgotten.
    pub fn ended(&mut self, key: &str, why: &str) -> Vec<Out> {
        let Some(f) = self.sessions.remove(key) else {
            return Vec::new();
        };
        // Nobody is left to answer: the client's permissions and reads are withdrawn.
        let mut out = self.withdraw_from_client(key);
        if let Some(turn) = f.turn {
            out.push(say(
                key,
                &format!("(pi-ide-broker: the pi session is gone: {why})"),
            ));
            out.push(turn_ended(&turn.id, StopReason::EndTurn));
        }
        out
    }

    /// The follow connection of `key` was dialled again after a broker restart: what the old
    /// broker was asked is lost with it. Its permissions are withdrawn (`$/cancel_request`); an
    /// open prompt turn ends, saying so (pi's turn goes on in pi); a watching turn stays open;
    /// a history wait is answered with an error.
    pub fn relinked(&mut self, key: &str) -> Vec<Out> {
        if !self.sessions.contains_key(key) {
            return Vec::new();
        }
        // The broker that asked for these is gone (it answered pi as it stopped): the
        // permissions are withdrawn from the client, the buffer reads forgotten.
        let mut out: Vec<Out> = self
            .take_reviews(key, None)
            .iter()
            .map(|(ours, _)| cancel_request(ours))
            .collect();
        self.reads.retain(|_, (s, _)| s != key);
        let Some(f) = self.sessions.get_mut(key) else {
            return out;
        };
        for (_, wait) in f.waits.drain() {
            match wait {
                BrokerWait::History(request) => out.push(Out::Client(jsonrpc::error(
                    &request,
                    INTERNAL_ERROR,
                    "pi-ide-broker restarted while the history was read; load the session again",
                ))),
                BrokerWait::Prompt => {
                    if let Some(turn) = f.turn.take() {
                        out.push(say(key, "(pi-ide-broker restarted: pi's turn goes on in pi, and this thread follows it again)"));
                        out.push(ready(key, false));
                        // One the client stopped says so, as pi's answer would have.
                        let stop = if turn.cancelled {
                            StopReason::Cancelled
                        } else {
                            StopReason::EndTurn
                        };
                        out.push(turn_ended(&turn.id, stop));
                    }
                }
                BrokerWait::Cancel => {}
            }
        }
        out
    }

    /// Ends the following of ACP session `key` (`session/close`, or a session followed again
    /// by `session/load`, `session/resume` or `session/new`): its ongoing work is cancelled as
    /// `session/cancel` cancels it, an open turn is answered `cancelled` (pi's answer to a
    /// prompt will not reach a closed connection), and the follow connection closes.
    fn unfollow(&mut self, key: &str) -> Vec<Out> {
        if !self.sessions.contains_key(key) {
            return Vec::new();
        }
        let mut out = self.cancel(key);
        out.extend(self.withdraw_from_client(key));
        if let Some(turn) = self.sessions.remove(key).and_then(|f| f.turn) {
            out.push(turn_ended(&turn.id, StopReason::Cancelled));
        }
        out.push(Out::Disconnect(key.to_string()));
        out
    }

    /// What ACP session `key` still asks of the client (permissions, buffer reads) taken
    /// back with `$/cancel_request`; a late answer finds nothing.
    fn withdraw_from_client(&mut self, key: &str) -> Vec<Out> {
        let mut out: Vec<Out> = self
            .take_reviews(key, None)
            .iter()
            .map(|(ours, _)| cancel_request(ours))
            .collect();
        let reads: Vec<String> = self
            .reads
            .iter()
            .filter(|(_, (s, _))| s == key)
            .map(|(ours, _)| ours.clone())
            .collect();
        for ours in reads {
            self.reads.remove(&ours);
            out.push(cancel_request(&ours));
        }
        out
    }
}

fn error_text(e: &Value) -> String {
    e.get("message")
        .and_then(Value::as_str)
        .unwrap_or("the pi session answered an error")
        .to_string()
}

mod review;
#[cfg(test)]
mod tests;
