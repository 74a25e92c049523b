//! Followers: an ACP door watching, prompting and reviewing one pi session.
//!
//! `GET /v1/follow?session=<key>` upgrades to a WebSocket on which `pi-ide-broker acp` follows
//! the pi session with that key (`GET /v1/pi-sessions?cwd=` lists the candidates). The broker
//! relays: the session's `pi/update`s go to every follower; a follower's `pi/history`,
//! `pi/prompt` and `pi/cancel` go to the session under ids of ours (a `pi/prompt` carries its
//! id as `prompt`, and a `pi/cancel {prompt}` names only the follower's own prompt, by that
//! id: [`on_follower_text`]); while a follower's turn is
//! open (`follow/review {ready}`) the session's diffs (`openDiff`) go to it as `pi/review`
//! instead of to the editor. The session's extension learns who follows from
//! `broker/followers`. Nothing here reads a transcript: the frames pass as they came.

use super::Session;
use crate::platform::sync::lock;
use crate::protocol::follow::{self as notice, Notice as _};
use crate::protocol::jsonrpc::{self, follow, Incoming};
use crate::registry::session::Follower;
use crate::registry::Registry;
use crate::wire::outbox::{Outbox, SessionSink};
use crate::wire::wsframe::{Frame, FrameReader};
use serde_json::{json, Map, Value};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncRead;

/// The native-protocol revision from which a client can be followed.
pub const FOLLOW_PROTOCOL: u32 = 2;

/// Whether `s` can be followed: a native session of a client that speaks the follow methods.
pub fn followable(s: &Session) -> bool {
    s.door == super::Door::Native
        && s.client
            .as_ref()
            .and_then(|c| c.protocol)
            .is_some_and(|p| p >= FOLLOW_PROTOCOL)
}

/// The owner's followable sessions working in `cwd` (the same folder or one inside it), the
/// most recently active first: what `GET /v1/pi-sessions?cwd=` lists and `acp` picks from.
/// An agent's session (one with a realm: a container's, a remote's) is never a candidate,
/// however recently active: the owner's editor would follow it unasked. It can still be
/// followed by its key, named explicitly ([`by_key`]).
pub fn candidates(reg: &Registry, cwd: &Path) -> Vec<Arc<Session>> {
    let cwd = crate::registry::router::normalize(cwd);
    let mut found: Vec<Arc<Session>> = reg
        .sessions()
        .into_iter()
        .filter(|s| followable(s) && s.realm.is_none() && s.cwd.starts_with(&cwd))
        .collect();
    found.sort_by_key(|s| std::cmp::Reverse((s.last_active.load(Ordering::Relaxed), s.since)));
    found
}

/// The followable session whose sticky key is `key`: an agent's keys carry its realm
/// (`remote:box/<key>`), so only a key that names the realm reaches an agent's session.
pub fn by_key(reg: &Registry, key: &str) -> Option<Arc<Session>> {
    reg.sessions()
        .into_iter()
        .filter(|s| followable(s) && s.key.as_deref() == Some(key))
        .max_by_key(|s| s.id)
}

/// One candidate as `GET /v1/pi-sessions` lists it.
pub fn describe(s: &Session) -> notice::PiSession {
    notice::PiSession {
        session: s.key.clone(),
        cwd: s.cwd_raw.clone(),
        since: s
            .since
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        editor: s.editor_id().as_deref().map(String::from),
        followers: lock(&s.followers).len(),
    }
}

/// Adds `f` to the followers of `session`, which is told.
fn join(session: &Session, f: Arc<Follower>) {
    lock(&session.followers).push(f);
    tell_session(session);
}

/// Lets `f` go from `session`: its reviews are answered as not reviewed, its buffer reads as
/// errors, its forwarded calls forgotten, and the session told.
fn let_go(session: &Session, f: &Follower) {
    set_reviewing(session, f, false);
    lock(&session.followers).retain(|x| x.id != f.id);
    lock(&session.follow_calls).retain(|_, (fid, _)| *fid != f.id);
    for (_, call) in lock(&f.reads).drain() {
        session.outbox.deliver(jsonrpc::error(
            &call,
            jsonrpc::NO_EDITOR,
            "the ACP editor left",
        ));
    }
    for (_, (call, tab)) in lock(&f.reviews).drain() {
        session.outbox.deliver(jsonrpc::result(
            &call,
            jsonrpc::diff_undelivered(&tab, "the ACP editor left before answering"),
        ));
    }
    tell_session(session);
}

/// Follows `session` on an upgraded WebSocket until the follower leaves, the session ends or
/// the broker stops.
pub async fn run<R>(
    reg: Arc<Registry>,
    mut reader: FrameReader<R>,
    sink: SessionSink,
    session: Arc<Session>,
    name: String,
    reads_buffers: bool,
) where
    R: AsyncRead + Unpin + Send + 'static,
{
    let id = reg.next_session_id();
    let kill = reg.cancel.child_token();
    let follower = Arc::new(Follower::new(
        id,
        name,
        Outbox::new(id, sink, kill.clone(), &reg.tracker),
        reads_buffers,
    ));
    tracing::info!(follower = id, session = session.id, client = %follower.name, "a follower attached");
    follower.outbox.deliver(
        notice::Attached {
            session: session.key.clone(),
            cwd: session.cwd_raw.clone(),
            client: session.client.clone(),
        }
        .frame(),
    );
    join(&session, follower.clone());
    reg.changed();
    let write_failed = follower.outbox.broken().failed();
    tokio::pin!(write_failed);
    let reason = loop {
        tokio::select! {
            biased;
            _ = kill.cancelled() => break "broker stopping",
            _ = session.gone.cancelled() => break "the pi session ended",
            frame = reader.next() => match frame {
                Ok(None) | Ok(Some(Frame::Close(_))) => break "closed by follower",
                Err(e) => {
                    tracing::info!(follower = id, error = %e, "follower connection error");
                    break "connection error";
                }
                Ok(Some(Frame::Text(t))) => on_follower_text(&session, &follower, t),
                Ok(Some(Frame::Binary(b))) => match std::str::from_utf8(b) {
                    Ok(t) => on_follower_text(&session, &follower, t),
                    Err(_) => _ = follower.outbox.deliver(jsonrpc::error(&Value::Null, jsonrpc::PARSE_ERROR, "Parse error: binary frame is not UTF-8")),
                },
                Ok(Some(Frame::Ping(p))) => follower.outbox.pong(p),
                Ok(Some(Frame::Pong(_))) => {}
            },
            _ = &mut write_failed => break "write failed",
        }
    };
    leave(&reg, &session, &follower, reason).await;
}

/// One text frame from follower `f` of `session`: a forwarded request goes on to the session
/// under a `follow-…` id, `follow/review` sets its readiness, an answer settles its review or
/// buffer read; anything else gets its JSON-RPC error. Public for the fuzz target.
pub fn on_follower_text(session: &Session, f: &Follower, text: &str) {
    match jsonrpc::classify(text) {
        Err(r) => {
            tracing::info!(follower = f.id, error = %r.message, "invalid message from follower");
            f.outbox.deliver(jsonrpc::rejection(&r));
        }
        Ok(Incoming::Request {
            id,
            method,
            mut msg,
        }) => {
            if !follow::FORWARDED.contains(&method.as_str()) {
                f.outbox.deliver(jsonrpc::error(
                    &id,
                    jsonrpc::METHOD_NOT_FOUND,
                    &format!(
                        "a follower may send {:?}, not {method:?}",
                        follow::FORWARDED
                    ),
                ));
                return;
            }
            let ours = format!("follow-{}-{}", f.id, session.mint_delegated_id());
            if method == follow::PROMPT {
                // The session tells its followers' prompts apart by the id it sees.
                set_param(&mut msg, "prompt", Value::String(ours.clone()));
            } else if method == follow::CANCEL && !name_own_prompt(session, f, &mut msg) {
                // The prompt it names is answered already (or is none of its own): nothing
                // of this follower runs to be stopped.
                f.outbox.deliver(jsonrpc::result(&id, json!({})));
                return;
            }
            lock(&session.follow_calls).insert(ours.clone(), (f.id, id.clone()));
            msg.insert("id".into(), Value::String(ours.clone()));
            if !session.outbox.deliver(Value::Object(msg).to_string()) {
                lock(&session.follow_calls).remove(&ours);
                f.outbox.deliver(jsonrpc::error(
                    &id,
                    jsonrpc::NO_EDITOR,
                    "the pi session is gone",
                ));
            }
        }
        Ok(Incoming::Notification { method, msg }) => {
            if method == follow::READY {
                // Params of another shape read as "not ready".
                let ready = notice::ReviewReady::from_message(&msg).is_some_and(|r| r.ready);
                set_reviewing(session, f, ready);
            }
        }
        Ok(Incoming::Response { id, msg }) => {
            if id.as_str().is_some_and(|k| k.starts_with("read-")) {
                answer_read(session, f, &id, msg)
            } else {
                answer_review(session, f, &id, msg)
            }
        }
    }
}

/// `params[name] = value` in a request (its params made an object if they were none).
fn set_param(msg: &mut Map<String, Value>, name: &str, value: Value) {
    let params = msg
        .entry("params")
        .or_insert_with(|| Value::Object(Map::new()));
    if !params.is_object() {
        *params = Value::Object(Map::new());
    }
    if let Value::Object(p) = params {
        p.insert(name.to_string(), value);
    }
}

/// A follower's `pi/cancel {prompt}` names its own `pi/prompt` by the follower's id: that is
/// rewritten to the id the session saw it under. Whether the cancel goes on: without a
/// `prompt` (an older follower) it does, as it came; naming no prompt of this follower that
/// the session still runs, it does not (a follower never stops another's prompt).
fn name_own_prompt(session: &Session, f: &Follower, msg: &mut Map<String, Value>) -> bool {
    let Some(theirs) = msg.get("params").and_then(|p| p.get("prompt")).cloned() else {
        return true;
    };
    let ours = lock(&session.follow_calls)
        .iter()
        .find(|(_, (fid, id))| *fid == f.id && *id == theirs)
        .map(|(ours, _)| ours.clone());
    match ours {
        Some(ours) => {
            set_param(msg, "prompt", Value::String(ours));
            true
        }
        None => false,
    }
}

/// Marks `f` ready (or not) to review; the latest to open its turn reviews first. A turn
/// opened again while one was open (a client's second prompt ends its first) is the latest.
fn set_reviewing(session: &Session, f: &Follower, ready: bool) {
    let before = session.reviewer().map(|r| r.id);
    let was = f.reviewing.swap(ready, Ordering::AcqRel);
    if was == ready && !ready {
        return;
    }
    {
        let mut list = lock(&session.followers);
        if ready {
            if let Some(at) = list.iter().position(|x| x.id == f.id) {
                let me = list.remove(at);
                list.push(me);
            }
            if !was {
                session.reviewers.fetch_add(1, Ordering::AcqRel);
            }
        } else {
            session.reviewers.fetch_sub(1, Ordering::AcqRel);
        }
    }
    // What the session is told (how many follow, who reviews) changes only with the reviewer.
    if session.reviewer().map(|r| r.id) != before {
        tell_session(session);
    }
}

/// `broker/followers` to the session: how many follow it, and whether one reviews.
fn tell_session(session: &Session) {
    let (count, buffers) = {
        let list = lock(&session.followers);
        (list.len(), list.iter().any(|f| f.reads_buffers))
    };
    let reviewer = session.reviewer().map(|f| f.name.clone());
    let told = crate::protocol::follow::Followers {
        count,
        reviewer,
        buffers,
    };
    session.notify(told.frame());
}

/// The follower's answer to a review: back to the session as its `openDiff` result. An error
/// (or a malformed answer) is a diff nobody reviewed, never an error: on an error pi would
/// write unreviewed.
fn answer_review(session: &Session, f: &Follower, id: &Value, msg: Map<String, Value>) {
    let key = id.as_str().unwrap_or_default();
    let Some((call, tab)) = lock(&f.reviews).remove(key) else {
        tracing::info!(follower = f.id, %id, "answer to no pending review; ignored");
        return;
    };
    let answer = match msg.get("result") {
        Some(r) if r.get("content").is_some_and(Value::is_array) => {
            jsonrpc::result(&call, r.clone())
        }
        _ => {
            let why = msg
                .get("error")
                .and_then(|e| e.get("message"))
                .and_then(Value::as_str)
                .unwrap_or("the ACP editor gave no verdict");
            jsonrpc::result(&call, jsonrpc::diff_undelivered(&tab, why))
        }
    };
    session.outbox.deliver(answer);
}

/// A session's `openDiff` (its call id, its params) offered to the follower `f` to review.
pub fn review(session: &Session, f: &Follower, call: Value, tab: String, params: Option<&Value>) {
    let ours = f.mint_id("review");
    let asked: crate::protocol::follow::Review =
        crate::protocol::follow::params(params).unwrap_or_default();
    lock(&f.reviews).insert(ours.clone(), (call.clone(), tab.clone()));
    let sent = f.outbox.deliver(jsonrpc::request(
        &Value::String(ours.clone()),
        follow::REVIEW,
        crate::protocol::follow::to_params(&asked),
    ));
    if !sent {
        lock(&f.reviews).remove(&ours);
        session.outbox.deliver(jsonrpc::result(
            &call,
            jsonrpc::diff_undelivered(&tab, "the ACP editor is gone"),
        ));
    }
    tracing::info!(
        follower = f.id,
        session = session.id,
        "diff offered to the ACP editor"
    );
}

/// The session took back its diff (`notifications/cancelled {requestId}`: pi aborted while a
/// follower reviewed it): the review is forgotten (no answer is owed, as MCP says) and the
/// follower told under our id, so its ACP door withdraws the permission. Whether a follower
/// held it.
pub fn withdraw(session: &Session, call: &Value) -> bool {
    for f in lock(&session.followers).iter() {
        let ours = {
            let mut reviews = lock(&f.reviews);
            let found = reviews
                .iter()
                .find(|(_, (c, _))| c == call)
                .map(|(k, _)| k.clone());
            found.inspect(|k| _ = reviews.remove(k))
        };
        if let Some(ours) = ours {
            tracing::info!(
                follower = f.id,
                session = session.id,
                "diff withdrawn by the session"
            );
            f.outbox.deliver(jsonrpc::notification(
                jsonrpc::CANCELLED,
                json!({"requestId": ours, "reason": "pi stopped the call"}),
            ));
            return true;
        }
    }
    false
}

/// The follower's answer to a buffer read: back to the session as it came (a result or an
/// error), under the session's id; a result names the follower (`editor`), whose buffer it is.
fn answer_read(session: &Session, f: &Follower, id: &Value, mut msg: Map<String, Value>) {
    let Some(call) = lock(&f.reads).remove(id.as_str().unwrap_or_default()) else {
        return;
    };
    msg.insert("id".into(), call);
    if let Some(Value::Object(result)) = msg.get_mut("result") {
        result.insert("editor".into(), Value::String(f.name.clone()));
    }
    session.outbox.deliver(Value::Object(msg).to_string());
}

/// A session's `broker/read {path}`: asked of a follower whose client reads buffers (the
/// reviewer first), or refused when none does.
pub fn read(session: &Session, call: Value, params: Option<&Value>) {
    let Some(path) = params.and_then(|p| p.get("path")).and_then(Value::as_str) else {
        session.outbox.deliver(jsonrpc::error(
            &call,
            jsonrpc::INVALID_PARAMS,
            "broker/read needs {\"path\": \"<absolute path>\"}",
        ));
        return;
    };
    if let Some(realm) = &session.realm {
        // The follower's editor reads the owner's files: never for another realm's agent.
        tracing::info!(session = session.id, realm = %realm, "refused broker/read from an agent's session");
        session.outbox.deliver(jsonrpc::error(
            &call,
            jsonrpc::NO_EDITOR,
            &format!("broker/read is for the owner's own sessions; this session is an agent's ({realm}), and a following editor never reads files for it"),
        ));
        return;
    }
    let reviewer = session.reviewer().filter(|f| f.reads_buffers);
    let reader = reviewer.or_else(|| {
        lock(&session.followers)
            .iter()
            .rev()
            .find(|f| f.reads_buffers)
            .cloned()
    });
    let Some(f) = reader else {
        session.outbox.deliver(jsonrpc::error(
            &call,
            jsonrpc::NO_EDITOR,
            "no following ACP editor reads buffers",
        ));
        return;
    };
    let ours = f.mint_id("read");
    lock(&f.reads).insert(ours.clone(), call.clone());
    if !f.outbox.deliver(jsonrpc::request(
        &Value::String(ours.clone()),
        follow::READ_BUFFER,
        crate::protocol::follow::to_params(&crate::protocol::follow::ReadBuffer {
            path: path.to_string(),
        }),
    )) {
        lock(&f.reads).remove(&ours);
        session.outbox.deliver(jsonrpc::error(
            &call,
            jsonrpc::NO_EDITOR,
            "the ACP editor is gone",
        ));
    }
}

/// A transcript update from the session: to every follower, as it came.
pub fn fan_out(session: &Session, text: &str) {
    for f in lock(&session.followers).iter() {
        f.outbox.deliver(text.to_string());
    }
}

/// Whether a session's answer carries an id of a follower's request sent on to it.
pub fn is_forwarded(id: &Value) -> bool {
    id.as_str().is_some_and(|k| k.starts_with("follow-"))
}

/// The session's answer to a follower's request: back to that follower under its own id.
pub fn answer_forwarded(session: &Session, id: &Value, mut msg: Map<String, Value>) {
    let key = id.as_str().unwrap_or_default();
    let Some((fid, theirs)) = lock(&session.follow_calls).remove(key) else {
        tracing::info!(session = session.id, %id, "answer to no follower's request; ignored");
        return;
    };
    if let Some(f) = lock(&session.followers).iter().find(|f| f.id == fid) {
        msg.insert("id".into(), theirs);
        f.outbox.deliver(Value::Object(msg).to_string());
    }
}

/// The follower's end: its reviews are answered (not reviewed), its forwarded calls
/// forgotten, the session told; it hears why, if the session ended.
async fn leave(reg: &Registry, session: &Session, f: &Arc<Follower>, reason: &str) {
    let_go(session, f);
    // A broker that stops says nothing: the session comes back with the broker, and the
    // follower redials it.
    if session.gone.is_cancelled() && !reg.accepting.is_cancelled() {
        f.outbox.deliver(
            notice::Ended {
                reason: reason.to_string(),
            }
            .frame(),
        );
    }
    f.outbox.finish(Duration::from_secs(1)).await;
    reg.changed();
    tracing::info!(
        follower = f.id,
        session = session.id,
        reason,
        "a follower left"
    );
}

#[cfg(test)]
mod tests;
