//! The link task of one editor: the only reader of its socket, redialled with backoff.
//!
//! Dial (`wsupgrade`), MCP handshake, health pings, frames in and out, and the redial with
//! backoff; the only reader of the editor's socket.

use super::dial::{dial, frame_str, DialError, Dialled};
use super::handle::*;
use super::health::{Action as HealthAction, Health};
use super::inbound::handle_editor_frame;

use super::Error;
use super::{taken, Editor, LinkHost, CLOSE_WAIT};
use crate::platform::sync::lock;
use crate::sys::config::Config;
use crate::wire::shared_writer::Broken;
use crate::wire::wsframe::{Frame, Out};

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

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
            Ok(Err(DialError::Foreign(e))) => {
                // Not the user's editor: it is not dialled again until its lockfile is read
                // afresh and passes (the watcher's next look).
                tracing::warn!(editor = %editor.id, reason = %e, "lockfile refused at the dial");
                host.lockfile_refused(&editor, e.to_string());
                return;
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
                    DialError::Answered(_) | DialError::Other(_) | DialError::Foreign(_) => {
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

/// Before every dial: the lockfile must still be there, name this editor, its pid be alive
/// and nothing of it be another user's (the re-read lockfile is taken: a new token). False
/// once the editor is gone (told to `host`; a lockfile found foreign is listed as refused).
fn still_there(editor: &Arc<Editor>, host: &dyn LinkHost) -> bool {
    match host.read_lockfile(editor) {
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
        Err(Error::Incomplete) => true,
        Err(e) if e.is_foreign() => {
            tracing::warn!(editor = %editor.id, reason = %e, "lockfile refused before the dial");
            host.lockfile_refused(editor, e.to_string());
            false
        }
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
    let mut cancelled = crate::wire::woken::WhenWoken::new(cancelled);
    let deadline_added = editor.deadline_added.notified();
    tokio::pin!(deadline_added);
    let sleep = tokio::time::sleep_until(live.health.next_wake());
    tokio::pin!(sleep);
    let mut sleep = crate::wire::woken::WhenWoken::new(sleep);
    let write_failed = broken.failed();
    tokio::pin!(write_failed);
    let mut write_failed = crate::wire::woken::WhenWoken::new(write_failed);
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
    ) -> (Self, LinkReader, crate::platform::tcp::QuickAck, Broken) {
        let Dialled {
            reader,
            writer,
            quick_ack,
            client_port: _,
        } = link;
        let broken = editor.out.install(writer, OUTBOUND_QUEUE, host.tracker());
        close_leftovers(editor);
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
        sleep: &mut crate::wire::woken::WhenWoken<std::pin::Pin<&mut tokio::time::Sleep>>,
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
        quick_ack: &crate::platform::tcp::QuickAck,
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
    fn on_frame(&mut self, frame: Result<Option<Frame<'_>>, crate::wire::Error>) -> Step {
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

/// Closes in the editor the diffs a dead daemon or a lost link left open there (the
/// journal's, less those a session waits on): called as a link comes up, before anything
/// else is sent on it, so the user only ever sees the diffs someone waits for. On a
/// Claude-family editor only marked names are closed: its `close_tab` deletes the buffer
/// any other name matches.
fn close_leftovers(editor: &Editor) {
    let key = editor.key();
    let waiting = |tab: &str| editor.pending.iter().any(|p| p.editor_tab() == Some(tab));
    for tab in editor.diffs.leftovers(key, waiting) {
        if !super::family::rules(editor.family).may_close_leftover(&tab) {
            editor.diffs.closed(key, &tab);
            continue;
        }
        tracing::info!(editor = %editor.id, tab = %tab, "closing a diff left open by a daemon that died or a link that was lost");
        if let Err(e) = editor.close_tab(&tab) {
            tracing::warn!(editor = %editor.id, error = %e, "could not close a diff left open; it is tried again on the next link");
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
