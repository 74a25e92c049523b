//! Single-client editors: a link the editor closed for another client is `taken`, not redialled.
//!
//! Single-client editors (the Claude Code VS Code extension keeps one client at a time and
//! closes the older one when another connects): a link the editor closed while another client
//! holds it is `taken`, and the broker leaves that client alone (`[editors] single_client =
//! "yield"`) instead of redialling into an eviction loop with it.
//!
//! A taken editor is still the editor of its folders: sessions are routed to it, and a call to
//! it is answered. The call is parked, the link dialled for it, and the call sent once the link
//! is up (or answered as undelivered when the link cannot be had within the call's time); the
//! link taken back this way is handed back once idle for [`HAND_BACK`], so the other client,
//! which reconnects by itself, has the editor again between the broker's calls.

use super::parked::Parked;
use super::{Editor, LinkHost, LinkState};
use crate::platform::sync::lock;
use crate::sys::config::{Config, SingleClient};
use crate::wire::shared_writer::Refused;
use crate::wire::wsframe::Out;
use futures_util::FutureExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The fastest the broker looks whether the other client has left, whatever the config says.
const MIN_PROBE: Duration = Duration::from_millis(20);
/// How long a link taken back for calls stays up after the last of them was answered.
pub(super) const HAND_BACK: Duration = Duration::from_secs(3);
/// After a hand-back, how long the other client has to come back before the broker, finding
/// the editor free, takes it for itself.
pub(super) const SETTLE: Duration = Duration::from_secs(2);
/// How long a call with no deadline of its own (a diff) waits for the link dialled for it.
const PARK_BOUND: Duration = Duration::from_secs(10);

/// How many times a parked call is written at most: once, and once more when the editor's
/// close cut it before its answer came (only the `RESENDABLE` tools of `handle`).
const MAX_SENDS: u8 = 2;

/// Why an editor handed back is taken.
pub(super) fn handed_back_reason() -> String {
    "handed back to the other client after the broker's calls; it keeps one client at a time".into()
}

impl Editor {
    /// Keeps the frame of call `uid` for the link to come, if the editor is taken (or being
    /// taken back for calls); `Gone` otherwise. Called with no writer installed, under its lock.
    pub(super) fn park(
        &self,
        uid: u64,
        frame: Out,
        deadline: Option<Instant>,
    ) -> Result<(), Refused> {
        let taken = self.state() == LinkState::Taken;
        if !taken && !self.reclaimed.load(Ordering::Acquire) {
            return Err(Refused::Gone);
        }
        let by = deadline.unwrap_or_else(|| Instant::now() + PARK_BOUND);
        let resend = self.pending.get(&uid).is_some_and(|p| p.resendable());
        lock(&self.parked).push(Parked {
            uid,
            frame,
            by,
            sends: 0,
            resend,
        });
        if taken {
            self.wanted.notify_one();
        }
        Ok(())
    }

    /// Sends the parked calls still pending (those parked while the link was in its
    /// handshake), once the writer is installed.
    pub(super) fn flush_parked(&self) {
        let parked = std::mem::take(&mut *lock(&self.parked));
        for p in parked {
            if !self.pending.contains_key(&p.uid) {
                continue;
            }
            let uid = p.uid;
            let (frame, kept) = p.written();
            lock(&self.sent).push(kept);
            if let Err(r) = self.out.send(frame) {
                let why = self.refusal(r).to_string();
                if let Some((_, pending)) = self.pending.remove(&uid) {
                    self.undelivered(pending, &why);
                }
            }
        }
    }

    /// The frames of the parked calls still pending, for a dial to write right after its
    /// upgrade; each is kept in `sent` until the link ends.
    pub(super) fn parked_for_dial(&self) -> Vec<Out> {
        let parked = std::mem::take(&mut *lock(&self.parked));
        let mut frames = Vec::with_capacity(parked.len());
        let mut sent = lock(&self.sent);
        for p in parked {
            if self.pending.contains_key(&p.uid) {
                let (frame, kept) = p.written();
                frames.push(frame);
                sent.push(kept);
            }
        }
        frames
    }

    /// The editor closed the link for its other client: the calls written on it that are
    /// still unanswered, may be sent again (`RESENDABLE`, written fewer than [`MAX_SENDS`]
    /// times) and still have time park again, ahead of any parked since; the link dialled
    /// next sends them. The rest stay in `sent`, to be answered by [`Editor::fail_sent`].
    pub(super) fn requeue_cut(&self) {
        let now = Instant::now();
        let (again, rest): (Vec<Parked>, Vec<Parked>) = std::mem::take(&mut *lock(&self.sent))
            .into_iter()
            .filter(|p| self.pending.contains_key(&p.uid))
            .partition(|p| p.resend && p.sends < MAX_SENDS && p.by > now);
        if !again.is_empty() {
            tracing::info!(editor = %self.id, calls = again.len(), "calls cut by the editor's close before their answers; sending them again on the next link");
        }
        *lock(&self.sent) = rest;
        let mut parked = lock(&self.parked);
        parked.splice(0..0, again);
    }

    /// The link ended: the calls written on it still unanswered (and not parked again) are
    /// answered as undelivered (a diff `DIFF_REJECTED`).
    pub(super) fn fail_sent(&self, why: &str) {
        let sent = std::mem::take(&mut *lock(&self.sent));
        for p in sent {
            if let Some((_, pending)) = self.pending.remove(&p.uid) {
                self.undelivered(pending, why);
            }
        }
    }

    /// The calls parked for the next link.
    pub(super) fn parked_uids(&self) -> Vec<u64> {
        lock(&self.parked).iter().map(|p| p.uid).collect()
    }

    /// Answers the parked calls whose time is up; the earliest time still waited for.
    fn expire_parked(&self, now: Instant) -> Option<Instant> {
        let due: Vec<Parked> = {
            let mut parked = lock(&self.parked);
            let (due, keep) = std::mem::take(&mut *parked)
                .into_iter()
                .partition(|p| p.by <= now);
            *parked = keep;
            due
        };
        for p in due {
            if let Some((_, pending)) = self.pending.remove(&p.uid) {
                tracing::warn!(editor = %self.id, "a call to the taken editor could not be sent: no link within its time");
                self.undelivered(
                    pending,
                    "is held by another client and the broker could not link to it within the call's time",
                );
            }
        }
        lock(&self.parked).iter().map(|p| p.by).min()
    }
}

/// The backoff between dials, during which parked calls whose time is up are answered; false
/// once the editor is gone.
pub(super) async fn pause(editor: &Editor, delay: Duration) -> bool {
    let until = Instant::now() + delay;
    loop {
        let now = Instant::now();
        let next = editor.expire_parked(now).map_or(until, |at| at.min(until));
        if now >= until {
            return true;
        }
        tokio::select! {
            _ = editor.cancel.cancelled() => return false,
            _ = tokio::time::sleep_until(next) => {}
        }
    }
}

/// After the editor closed the link whose local port was `client_port`: why it counts as taken
/// (another client holds it now and the policy yields), or `None` (redial as for any lost
/// link). Knowing needs the kernel's connection table (Linux); elsewhere it is never taken.
pub(super) fn taken_by_another(
    editor: &Editor,
    config: &Config,
    client_port: u16,
) -> Option<String> {
    if config.editors.single_client(editor.family) != SingleClient::Yield {
        return None;
    }
    let lf = editor.lockfile();
    let port = lf.port;
    let others = crate::platform::ports::clients_of(lf.pid, port, Some(client_port))?;
    (others > 0).then(|| {
        format!(
            "the editor closed the broker's link when another client connected ({others} now \
             connected to port {port}); it keeps one client at a time"
        )
    })
}

/// Holds the link down while the editor is taken: until a session calls it (it needs the
/// editor: the link is then taken back for calls, and handed back once idle), the other client
/// has gone (looked up every `taken_probe_ms` without connecting, the first time after
/// `settle`), or the editor is gone (false). Sessions stay attached and are told.
pub(super) async fn wait_while_taken(
    editor: &Arc<Editor>,
    host: &dyn LinkHost,
    reason: String,
    settle: Duration,
) -> bool {
    tracing::warn!(editor = %editor.id, reason = %reason, "editor taken by another client; yielding until a session calls it or the other client leaves");
    mark_taken(editor, host, &reason);
    let (pid, port) = {
        let lf = editor.lockfile();
        (lf.pid, lf.port)
    };
    let mut nap = settle;
    loop {
        if !lock(&editor.parked).is_empty() {
            return reclaim(editor);
        }
        let probe = Duration::from_millis(host.config().editors.taken_probe_ms).max(MIN_PROBE);
        tokio::select! {
            _ = editor.cancel.cancelled() => return false,
            _ = editor.wanted.notified() => return reclaim(editor),
            _ = tokio::time::sleep(std::mem::take(&mut nap).max(probe)) => {
                if crate::platform::ports::clients_of(pid, port, None).is_none_or(|n| n == 0) {
                    tracing::info!(editor = %editor.id, "the other client left the editor; connecting again");
                    return true;
                }
            }
        }
    }
}

/// The editor is taken: its state says so (with why), its attached sessions are told, and
/// sessions waiting for an editor may be placed on it (it is routable: its calls are answered
/// by linking for them). What the link task does on entering the state, and the registry's
/// model test plays.
pub(crate) fn mark_taken(editor: &Arc<Editor>, host: &dyn LinkHost, reason: &str) {
    {
        let mut l = lock(&editor.link);
        l.state = LinkState::Taken;
        l.reason = Some(reason.to_string());
    }
    // Calls from now on park and wake the waiting link task; one parked before is seen by it.
    // A wake-up stored by an earlier call would take the editor back for nothing.
    editor.reclaimed.store(false, Ordering::Release);
    let _ = editor.wanted.notified().now_or_never();
    host.state_changed();
    announce(editor, host, "taken", Some(reason));
    host.editor_routable(editor);
}

/// A session called the taken editor: the link is dialled for its calls (they park until it
/// is up) and handed back once idle.
fn reclaim(editor: &Editor) -> bool {
    tracing::info!(editor = %editor.id, "a session called the taken editor; connecting for its calls");
    editor.reclaimed.store(true, Ordering::Release);
    true
}

/// Once the link is up again after being taken: the attached sessions hear it is back. A link
/// taken back for calls keeps saying so (status shows it) until it is handed back.
pub(super) fn announce_back(editor: &Arc<Editor>, host: &dyn LinkHost) {
    let reclaimed = editor.reclaimed.load(Ordering::Acquire);
    let was = {
        let mut l = lock(&editor.link);
        let was = l.reason.take();
        if reclaimed {
            l.reason = Some(format!(
                "linked for the broker's calls while another client holds the editor; handed \
                 back after {} s idle",
                HAND_BACK.as_secs()
            ));
        }
        was
    };
    if was.is_some() {
        host.state_changed();
        announce(editor, host, "ready", None);
    }
}

/// `broker/editor_state {editor, state, reason}` to every session attached to `editor`.
fn announce(editor: &Arc<Editor>, host: &dyn LinkHost, state: &'static str, reason: Option<&str>) {
    use crate::protocol::native::{EditorState, Notice as _};
    let told = EditorState {
        editor: editor.id.clone(),
        state,
        reason: reason.map(String::from),
    };
    host.broadcast(editor, &told.frame());
}
