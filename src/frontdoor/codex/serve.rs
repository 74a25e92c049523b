//! The hub socket's life on Unix: claimed (never stolen), served to the user's own processes,
//! removed at stop when it is still the one the broker bound.

use super::{dir_problem, forget, frame, hub, record, HubOwner};
use crate::platform::local::{Listener, Stream};
use crate::registry::Registry;
use serde_json::json;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A connection with no frame for this long is closed (Codex opens one per request).
const IDLE: Duration = crate::frontdoor::KEEP_ALIVE_IDLE;

/// A hub that drops the broker's watching connection sooner than this and is still alive is
/// looked at again only after [`RECHECK`], so one that closes unknown clients at once is not
/// dialled in a loop (a hub that went is taken over at once).
const SHORT_WATCH: Duration = Duration::from_secs(1);
const RECHECK: Duration = Duration::from_secs(10);

/// What the door found at the socket.
enum Claim {
    /// It bound the socket (with the file's identity, to remove only its own at stop).
    Bound(Listener, Option<(u64, u64)>),
    /// A live hub holds it: this connection to it, and who it is.
    Held(Stream, String),
    /// It will not serve there, and why.
    Refused(String),
}

/// Serves the hub at `socket` while the broker runs, or waits for the hub that holds it to go.
pub(super) async fn run(reg: Arc<Registry>, socket: std::path::PathBuf) {
    // The last watch ended within SHORT_WATCH (a hub that drops unknown clients at once).
    let mut dropped_fast = false;
    loop {
        match claim(&socket).await {
            Claim::Bound(listener, identity) => {
                record(
                    &reg,
                    &socket,
                    HubOwner::Broker,
                    "the broker serves Codex's /ide here".into(),
                );
                tracing::info!(socket = %socket.display(), "codex hub: serving Codex's /ide for your editors");
                accept_loop(&reg, listener).await;
                remove_if_ours(&socket, identity);
                forget(&socket);
                return;
            }
            Claim::Held(stream, who) => {
                let detail = format!("{who} serves it (the Codex app or extension): Codex's /ide gets its context, not the broker's editors'");
                if !dropped_fast {
                    tracing::info!(socket = %socket.display(), "codex hub: {detail}; the broker waits for it to go");
                }
                record(&reg, &socket, HubOwner::Other, detail);
                if dropped_fast {
                    // Alive, but it drops a silent client at once: look again later, not in a loop.
                    drop(stream);
                    dropped_fast = false;
                    tokio::select! {
                        _ = reg.accepting.cancelled() => { forget(&socket); return; }
                        _ = tokio::time::sleep(RECHECK) => {}
                    }
                    continue;
                }
                let since = Instant::now();
                if !watch(&reg, stream).await {
                    forget(&socket);
                    return;
                }
                dropped_fast = since.elapsed() < SHORT_WATCH;
            }
            Claim::Refused(why) => {
                tracing::error!(socket = %socket.display(), "codex hub: not served: {why}");
                record(&reg, &socket, HubOwner::Refused, why);
                return;
            }
        }
    }
}

/// Checks the dir as Codex does, leaves a live socket to its owner, replaces a dead one of the
/// user's, and binds (0600, in a 0700 dir made when missing).
async fn claim(socket: &Path) -> Claim {
    let Some(dir) = socket.parent() else {
        return Claim::Refused(format!("{} has no parent dir", socket.display()));
    };
    if let Some(why) = dir_problem(dir) {
        return Claim::Refused(why);
    }
    if let Err(e) = crate::platform::local::secure_dir(dir) {
        return Claim::Refused(e.to_string());
    }
    match std::fs::symlink_metadata(socket) {
        Ok(meta) => {
            let me = crate::platform::user::uid();
            if let Some((uid, _)) = crate::platform::user::owner_and_mode(&meta) {
                if uid != me {
                    return Claim::Refused(format!(
                        "{} belongs to uid {uid}, not to you (uid {me}); the broker never replaces another user's socket: remove it",
                        socket.display()
                    ));
                }
            }
            if let Ok(s) = Stream::connect(socket).await {
                let who = describe(&s);
                return Claim::Held(s, who);
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Claim::Refused(format!("cannot read {}: {e}", socket.display())),
    }
    // A dead socket of the user's is replaced by `bind`, which probes it once more.
    match crate::platform::local::bind(socket).await {
        Ok(l) => {
            let identity = std::fs::symlink_metadata(socket)
                .ok()
                .and_then(|m| crate::platform::user::file_identity(&m));
            Claim::Bound(l, identity)
        }
        Err(crate::platform::Error::AlreadyRunning { .. }) => match Stream::connect(socket).await {
            Ok(s) => {
                let who = describe(&s);
                Claim::Held(s, who)
            }
            Err(e) => Claim::Refused(format!("{} came and went: {e}", socket.display())),
        },
        Err(e) => Claim::Refused(e.to_string()),
    }
}

/// "pid 42 (Codex)", from the listener's credentials.
fn describe(s: &Stream) -> String {
    match crate::platform::peer::of_stream(s) {
        Ok(f) => match (f.pid, f.program) {
            (Some(pid), Some(p)) => format!("pid {pid} ({p})"),
            (Some(pid), None) => format!("pid {pid}"),
            _ => format!("a process of uid {}", f.uid),
        },
        Err(_) => "another process".into(),
    }
}

/// Holds a connection to the hub that owns the socket until it closes (`true`: it is gone,
/// look again) or the broker stops (`false`). A discovery question is answered "no": the
/// broker does not provide through another hub.
async fn watch(reg: &Registry, stream: Stream) -> bool {
    let (mut rd, mut wr) = stream.into_split();
    let max = reg.config().max_frame_bytes;
    loop {
        let next = tokio::select! {
            _ = reg.accepting.cancelled() => return false,
            f = frame::read_frame(&mut rd, max) => f,
        };
        let Ok(Some(bytes)) = next else {
            return true;
        };
        let Ok(msg) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
            continue;
        };
        if msg.get("type").and_then(|t| t.as_str()) == Some("client-discovery-request") {
            let no = json!({"type": "client-discovery-response", "requestId": msg.get("requestId"),
                            "response": {"canHandle": false}});
            if frame::write_frame(&mut wr, no.to_string().as_bytes())
                .await
                .is_err()
            {
                return true;
            }
        }
    }
}

async fn accept_loop(reg: &Arc<Registry>, listener: Listener) {
    loop {
        let accepted = tokio::select! {
            _ = reg.accepting.cancelled() => return,
            r = listener.accept() => r,
        };
        match accepted {
            Ok(stream) => {
                reg.tracker.spawn(connection(reg.clone(), stream));
            }
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "codex hub: accept failed; retrying in 100 ms");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// One client of the hub: the user's own processes only (the peer's uid from the kernel, as
/// Codex checks the hub's), frames answered in order until it closes, idles or misbehaves.
async fn connection(reg: Arc<Registry>, stream: Stream) {
    let me = crate::platform::user::uid();
    match crate::platform::peer::of_stream(&stream) {
        Ok(f) if f.uid == me => {}
        Ok(f) => {
            tracing::warn!(uid = f.uid, pid = ?f.pid, "codex hub: refused a connection of another user (the hub serves only uid {me})");
            return;
        }
        Err(e) => {
            tracing::warn!(error = %e, "codex hub: refused a connection whose credentials could not be read");
            return;
        }
    }
    let max = reg.config().max_frame_bytes;
    let (mut rd, mut wr) = stream.into_split();
    loop {
        let next = tokio::select! {
            _ = reg.cancel.cancelled() => return,
            r = tokio::time::timeout(IDLE, frame::read_frame(&mut rd, max)) => r,
        };
        let bytes = match next {
            Err(_) | Ok(Ok(None)) => return,
            Ok(Ok(Some(b))) => b,
            Ok(Err(e @ frame::FrameError::TooLarge { .. })) => {
                tracing::warn!(error = %e, "codex hub: closing a connection");
                return;
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "codex hub: a connection ended");
                return;
            }
        };
        if let Some(answer) = hub::answer(&reg, &bytes).await {
            if frame::write_frame(&mut wr, answer.to_string().as_bytes())
                .await
                .is_err()
            {
                return;
            }
        }
    }
}

/// Removes the socket at stop when it is still the file the broker bound (a hub that took the
/// path over since keeps its own).
fn remove_if_ours(socket: &Path, identity: Option<(u64, u64)>) {
    let now = std::fs::symlink_metadata(socket)
        .ok()
        .and_then(|m| crate::platform::user::file_identity(&m));
    if identity.is_some() && now == identity {
        let _ = std::fs::remove_file(socket);
    }
}
