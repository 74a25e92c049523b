//! One way to write frames to a socket that several tasks send on.
//!
//! An editor link (every session's calls, the link's pings and pongs) and a session (every
//! editor's answers and notices, the session's own replies) both write through a
//! [`SharedWriter`].
//!
//! Why not one writer task fed by a channel (tokio-tungstenite's split sink): a sender that
//! writes its frame itself when nothing is queued wakes no task; context switches per call
//! went from 5-9 to 2-2.5 and the realistic 1-session CPU ratio from 2.59x to 1.38x the
//! relay's (`benches/README.md`, "A current-thread runtime and two tasks per call").
//!
//! **The cross-task waker contract.** Installing a socket spawns its writer task, whose only
//! job is what senders could not finish. A sender writes its frame to the socket itself when
//! nothing is queued before it and the socket takes it at once, so a call wakes no task on its
//! way; it does so with the writer task's waker, so whatever the socket does not take now
//! (bytes the sink keeps, a flush that did not finish) is finished by the writer task when the
//! socket has room. Otherwise the frame is queued and the writer task, woken, writes the queue
//! in order. A frame is written directly only when nothing is queued before it, so frames
//! reach the socket in the order they were sent. Every step is a non-blocking write under a
//! lock held for that write alone.
//!
//! The socket's owner (the link task, the session task) never writes from its own loop: it
//! waits on [`Broken`] to learn that the socket failed, and ends with
//! [`SharedWriter::finish`], which lets the queue out, bounded, and closes the sink.

use futures_util::{Sink, SinkExt};
use platform::sync::lock;
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Why a frame was not taken.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// The queue is full (the editor is not reading).
    Full,
    /// The socket failed; its owner is ending the connection.
    Broken,
    /// There is no socket (the link is down, or the session has closed it).
    Gone,
}

/// A sink that can take a text frame given as borrowed parts: written to its socket at once
/// when it holds nothing else, so the frame is never assembled in a buffer of its own, and
/// copied only when the socket does not take all of it.
pub trait WriteParts {
    /// Writes the text frame whose payload is `parts`, concatenated, with `cx` as the waker
    /// for what the socket does not take now, or declines (the frame is then assembled and
    /// sent as any other). `Err` when the socket failed.
    fn write_parts(&mut self, cx: &mut Context<'_>, parts: &[&str])
        -> Result<PartsWritten, String>;
}

/// What [`WriteParts::write_parts`] did with a frame.
#[derive(Debug, PartialEq, Eq)]
pub enum PartsWritten {
    /// The socket took all of it.
    Done,
    /// The sink keeps (a copy of) what the socket did not take, and writes it when the
    /// socket wakes the task.
    Kept,
    /// The sink cannot write these parts directly (it holds other bytes, say): it took nothing.
    Declined,
}

/// A socket's write half: its sink, the frames waiting for it, and the writer task's waker.
struct Writer<S, T> {
    sink: S,
    queue: VecDeque<T>,
    cap: usize,
    /// The writer task's waker, known once it has driven this once.
    waker: Option<Waker>,
    /// Which installation this is (a writer task drives its own socket, never a successor).
    generation: u64,
    /// Told when the socket fails.
    broken: Broken,
    /// A flush did not finish: the sink holds bytes the writer task must flush when the
    /// socket has room. Without it, the writer task's turn has nothing to do.
    unflushed: bool,
}

impl<S, T> Writer<S, T>
where
    S: Sink<T> + Unpin,
    S::Error: std::fmt::Display,
{
    fn new(sink: S, cap: usize, generation: u64) -> Self {
        Writer {
            sink,
            queue: VecDeque::new(),
            cap,
            waker: None,
            generation,
            broken: Broken::default(),
            unflushed: false,
        }
    }

    /// Sends `frame`: written now if nothing is queued and the socket takes it, else queued
    /// for the writer task. Never waits.
    fn send(&mut self, frame: T) -> Result<(), Refused> {
        if self.broken.is_broken() {
            return Err(Refused::Broken);
        }
        let frame = match (self.queue.is_empty(), self.waker.clone()) {
            (true, Some(waker)) => match self.write_now(frame, &waker) {
                Ok(()) => return Ok(()),
                Err(Some(frame)) => frame,
                Err(None) => return Err(Refused::Broken),
            },
            _ => frame,
        };
        self.enqueue(frame)
    }

    /// [`send`](Self::send) for a text frame given as borrowed parts: written from them when
    /// nothing is queued and the socket takes it, else queued as `make` builds it.
    fn send_parts(&mut self, parts: &[&str], make: impl FnOnce() -> T) -> Result<(), Refused>
    where
        S: WriteParts,
    {
        if self.broken.is_broken() {
            return Err(Refused::Broken);
        }
        if let (true, Some(waker)) = (self.queue.is_empty(), self.waker.clone()) {
            match self
                .sink
                .write_parts(&mut Context::from_waker(&waker), parts)
            {
                Ok(PartsWritten::Done) => return Ok(()),
                Ok(PartsWritten::Kept) => {
                    self.unflushed = true;
                    return Ok(());
                }
                Ok(PartsWritten::Declined) => return self.send(make()),
                Err(e) => {
                    self.fail(e);
                    return Err(Refused::Broken);
                }
            }
        }
        self.enqueue(make())
    }

    /// Queues `frame` for the writer task (it cannot be written now), unless the queue is
    /// full.
    fn enqueue(&mut self, frame: T) -> Result<(), Refused> {
        if self.queue.len() >= self.cap {
            return Err(Refused::Full);
        }
        self.queue.push_back(frame);
        if let Some(w) = &self.waker {
            w.wake_by_ref();
        }
        Ok(())
    }

    /// Writes one frame with the writer task's waker (a write the socket cannot finish now
    /// is finished by the writer task when the socket wakes it). Gives the frame back when
    /// the sink is not ready; `Err(None)` when the socket failed.
    fn write_now(&mut self, frame: T, waker: &Waker) -> Result<(), Option<T>> {
        let mut cx = Context::from_waker(waker);
        match Pin::new(&mut self.sink).poll_ready(&mut cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(e)) => {
                self.fail(e);
                return Err(None);
            }
            Poll::Pending => return Err(Some(frame)),
        }
        if let Err(e) = Pin::new(&mut self.sink).start_send(frame) {
            self.fail(e);
            return Err(None);
        }
        match Pin::new(&mut self.sink).poll_flush(&mut cx) {
            Poll::Ready(Err(e)) => {
                self.fail(e);
                Err(None)
            }
            Poll::Ready(Ok(())) => Ok(()),
            // The rest is written when the socket wakes the writer task.
            Poll::Pending => {
                self.unflushed = true;
                Ok(())
            }
        }
    }

    /// A turn of whoever drives the queue (the writer task, or `finish`): remembers its
    /// waker, writes the queue and flushes. `Ready(Ok)` once everything is on the socket,
    /// `Ready(Err)` once the socket failed, `Pending` while the socket is full (the driver is
    /// woken when it has room).
    fn poll_drive(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), String>> {
        if !self.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            self.waker = Some(cx.waker().clone());
        }
        if let Some(e) = self.broken.why() {
            return Poll::Ready(Err(e.to_owned()));
        }
        if self.queue.is_empty() && !self.unflushed {
            return Poll::Ready(Ok(()));
        }
        while !self.queue.is_empty() {
            match Pin::new(&mut self.sink).poll_ready(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(self.fail(e))),
                Poll::Pending => return Poll::Pending,
            }
            if let Some(frame) = self.queue.pop_front() {
                if let Err(e) = Pin::new(&mut self.sink).start_send(frame) {
                    return Poll::Ready(Err(self.fail(e)));
                }
            }
        }
        match Pin::new(&mut self.sink).poll_flush(cx) {
            Poll::Ready(Err(e)) => Poll::Ready(Err(self.fail(e))),
            Poll::Ready(Ok(())) => {
                self.unflushed = false;
                Poll::Ready(Ok(()))
            }
            Poll::Pending => {
                self.unflushed = true;
                Poll::Pending
            }
        }
    }

    /// The socket failed: its owner is told (once), later frames are refused.
    fn fail(&mut self, e: impl std::fmt::Display) -> String {
        let e = e.to_string();
        self.broken.tell(&e);
        if let Some(w) = &self.waker {
            w.wake_by_ref();
        }
        e
    }

    /// Writes what is queued, then closes the sink, within `limit` (a peer that does not
    /// read gets no longer than that).
    async fn finish(mut self, limit: Duration) {
        let _ = tokio::time::timeout(limit, async move {
            if std::future::poll_fn(|cx| self.poll_drive(cx)).await.is_ok() {
                let _ = self.sink.close().await;
            }
        })
        .await;
    }
}

/// Told when a socket's write fails: what its owner waits on instead of writing itself.
#[derive(Clone, Default)]
pub struct Broken {
    told: CancellationToken,
    why: Arc<OnceLock<String>>,
}

impl Broken {
    fn tell(&self, why: &str) {
        if self.why.set(why.to_owned()).is_ok() {
            self.told.cancel();
        }
    }

    fn is_broken(&self) -> bool {
        self.why.get().is_some()
    }

    fn why(&self) -> Option<&str> {
        self.why.get().map(String::as_str)
    }

    /// Waits until the socket fails; its error.
    pub async fn failed(&self) -> String {
        self.told.cancelled().await;
        self.why().unwrap_or("write failed").to_owned()
    }
}

/// The write half of one socket, shared by every task that sends on it (see the module
/// header for the contract); empty while there is no socket. Cloning shares it.
pub struct SharedWriter<S, T>(Arc<Slot<S, T>>);

/// The socket's writer, if any, and the count of installations.
struct Slot<S, T> {
    writer: Mutex<Option<Writer<S, T>>>,
    installed: AtomicU64,
}

impl<S, T> Drop for Slot<S, T> {
    /// The last handle is gone: the writer task, woken, finds nothing to drive and ends.
    fn drop(&mut self) {
        let writer = self
            .writer
            .get_mut()
            .map_or_else(|e| e.into_inner().take(), Option::take);
        if let Some(waker) = writer.and_then(|w| w.waker) {
            waker.wake();
        }
    }
}

impl<S, T> Clone for SharedWriter<S, T> {
    fn clone(&self) -> Self {
        SharedWriter(self.0.clone())
    }
}

impl<S, T> Default for SharedWriter<S, T> {
    fn default() -> Self {
        SharedWriter(Arc::new(Slot {
            writer: Mutex::new(None),
            installed: AtomicU64::new(0),
        }))
    }
}

impl<S, T> SharedWriter<S, T>
where
    S: Sink<T> + Unpin + Send + 'static,
    S::Error: std::fmt::Display,
    T: Send + 'static,
{
    /// Puts a (new) socket in place, holding at most `cap` queued frames, and spawns its
    /// writer task on `tracker`; the owner waits on what it returns to learn that the socket
    /// failed.
    pub fn install(&self, sink: S, cap: usize, tracker: &TaskTracker) -> Broken {
        let generation = self.0.installed.fetch_add(1, Ordering::Relaxed) + 1;
        let writer = Writer::new(sink, cap, generation);
        let broken = writer.broken.clone();
        let old = lock(&self.0.writer).replace(writer);
        wake_out(old);
        tracker.spawn(write_queued(Arc::downgrade(&self.0), generation));
        broken
    }

    /// Sends `frame` (see the module header), or [`Refused::Gone`] when there is no socket.
    pub fn send(&self, frame: T) -> Result<(), Refused> {
        lock(&self.0.writer)
            .as_mut()
            .map_or(Err(Refused::Gone), |w| w.send(frame))
    }

    /// [`send`](Self::send), or, when there is no socket, `keep` is given the frame (under the
    /// same lock: a writer installed meanwhile waits, so its owner, flushing what was kept once
    /// it has installed, cannot miss it).
    pub fn send_or(
        &self,
        frame: T,
        keep: impl FnOnce(T) -> Result<(), Refused>,
    ) -> Result<(), Refused> {
        match lock(&self.0.writer).as_mut() {
            Some(w) => w.send(frame),
            None => keep(frame),
        }
    }

    /// [`send`](Self::send) for several frames in order, with no other sender's frame
    /// between them; stops at the first refusal.
    pub fn send_all(&self, frames: impl IntoIterator<Item = T>) -> Result<(), Refused> {
        let mut writer = lock(&self.0.writer);
        let w = writer.as_mut().ok_or(Refused::Gone)?;
        frames.into_iter().try_for_each(|f| w.send(f))
    }

    /// [`send`](Self::send) for a text frame given as borrowed parts: written from them when
    /// nothing is queued and the socket takes it, else queued as `make` builds it.
    pub fn send_parts(&self, parts: &[&str], make: impl FnOnce() -> T) -> Result<(), Refused>
    where
        S: WriteParts,
    {
        lock(&self.0.writer)
            .as_mut()
            .map_or(Err(Refused::Gone), |w| w.send_parts(parts, make))
    }

    /// Ends the socket: `last` (a close frame) sent after what is queued, all of it written
    /// and the sink closed within `limit`. Later sends get [`Refused::Gone`]. False if there
    /// was no socket.
    pub async fn finish(&self, last: Option<T>, limit: Duration) -> bool {
        let Some(mut writer) = self.take() else {
            return false;
        };
        if let Some(frame) = last {
            let _ = writer.send(frame);
        }
        writer.finish(limit).await;
        true
    }

    /// Drops the socket without a last write (the connection is already gone).
    pub fn discard(&self) {
        drop(self.take());
    }

    fn take(&self) -> Option<Writer<S, T>> {
        let mut writer = lock(&self.0.writer).take()?;
        // The writer task, woken, finds its socket gone and ends.
        if let Some(w) = writer.waker.take() {
            w.wake();
        }
        Some(writer)
    }
}

/// Wakes the writer task of a socket replaced by another, so it ends.
fn wake_out<S, T>(old: Option<Writer<S, T>>) {
    if let Some(waker) = old.and_then(|w| w.waker) {
        waker.wake();
    }
}

/// The writer task of installation `generation`: writes what senders queued or left
/// unflushed, each time the socket or a sender wakes it, until the socket fails, is taken out,
/// or is replaced, or every handle is gone.
async fn write_queued<S, T>(slot: Weak<Slot<S, T>>, generation: u64)
where
    S: Sink<T> + Unpin,
    S::Error: std::fmt::Display,
{
    std::future::poll_fn(|cx| {
        let Some(slot) = slot.upgrade() else {
            return Poll::Ready(());
        };
        let mut writer = lock(&slot.writer);
        match writer.as_mut().filter(|w| w.generation == generation) {
            None => Poll::Ready(()),
            Some(w) => match w.poll_drive(cx) {
                Poll::Ready(Err(_)) => Poll::Ready(()),
                // All written, or waiting for room: woken by the next sender or the socket.
                Poll::Ready(Ok(())) | Poll::Pending => Poll::Pending,
            },
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::task::Wake;

    /// A sink that takes `room` frames before it is full (until `drain`), records the order,
    /// and counts wake-ups of the waker it was polled with.
    #[derive(Default)]
    struct Socket {
        written: Vec<u32>,
        buffered: Vec<u32>,
        room: usize,
        fail: bool,
        /// Flushes do not finish (the kernel's buffer is full).
        stuck: bool,
        flushes: usize,
    }
    struct TestSocket(Arc<Mutex<Socket>>);
    impl Sink<u32> for TestSocket {
        type Error = String;
        fn poll_ready(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), String>> {
            let s = self.0.lock().unwrap();
            if s.fail {
                return Poll::Ready(Err("reset".into()));
            }
            if s.buffered.len() >= s.room {
                Poll::Pending
            } else {
                Poll::Ready(Ok(()))
            }
        }
        fn start_send(self: Pin<&mut Self>, item: u32) -> Result<(), String> {
            self.0.lock().unwrap().buffered.push(item);
            Ok(())
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), String>> {
            let mut s = self.0.lock().unwrap();
            s.flushes += 1;
            if s.fail {
                return Poll::Ready(Err("reset".into()));
            }
            if s.stuck {
                return Poll::Pending;
            }
            let b = std::mem::take(&mut s.buffered);
            s.written.extend(b);
            Poll::Ready(Ok(()))
        }
        fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), String>> {
            self.poll_flush(cx)
        }
    }

    /// Parts are a frame's decimal digits: written at once if the socket has room (a stuck
    /// socket keeps them), declined otherwise.
    impl WriteParts for TestSocket {
        fn write_parts(
            &mut self,
            _: &mut Context<'_>,
            parts: &[&str],
        ) -> Result<PartsWritten, String> {
            let mut s = self.0.lock().unwrap();
            if s.buffered.len() >= s.room {
                return Ok(PartsWritten::Declined);
            }
            let n = parts.concat().parse().map_err(|e| format!("{e}"))?;
            if s.stuck {
                s.buffered.push(n);
                return Ok(PartsWritten::Kept);
            }
            s.written.push(n);
            Ok(PartsWritten::Done)
        }
    }

    struct Count(Mutex<usize>);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            *self.0.lock().unwrap() += 1;
        }
        fn wake_by_ref(self: &Arc<Self>) {
            *self.0.lock().unwrap() += 1;
        }
    }

    fn setup(
        room: usize,
    ) -> (
        Writer<TestSocket, u32>,
        Arc<Mutex<Socket>>,
        Arc<Count>,
        Waker,
    ) {
        let socket = Arc::new(Mutex::new(Socket {
            room,
            ..Default::default()
        }));
        let out = Writer::new(TestSocket(socket.clone()), 3, 1);
        let count = Arc::new(Count(Mutex::new(0)));
        let waker = Waker::from(count.clone());
        (out, socket, count, waker)
    }

    #[test]
    fn an_idle_socket_is_written_by_the_sender_without_waking_the_writer_task() {
        let (mut out, socket, count, waker) = setup(10);
        // Before the writer task has driven it once, frames wait for it.
        out.send(1).unwrap();
        assert!(socket.lock().unwrap().written.is_empty());
        assert_eq!(
            out.poll_drive(&mut Context::from_waker(&waker)),
            Poll::Ready(Ok(()))
        );
        assert_eq!(socket.lock().unwrap().written, vec![1]);
        out.send(2).unwrap();
        out.send(3).unwrap();
        assert_eq!(socket.lock().unwrap().written, vec![1, 2, 3]);
        assert_eq!(out.queue.len(), 0);
        assert_eq!(*count.0.lock().unwrap(), 0, "no wake-up for a direct write");
    }

    #[test]
    fn a_full_socket_queues_in_order_and_the_writer_task_writes_the_rest() {
        let (mut out, socket, count, waker) = setup(0);
        let mut cx = Context::from_waker(&waker);
        assert!(out.poll_drive(&mut cx).is_ready(), "nothing to write yet");
        out.send(1).unwrap();
        out.send(2).unwrap();
        assert!(socket.lock().unwrap().written.is_empty());
        assert!(*count.0.lock().unwrap() >= 1, "the writer task was woken");
        // The socket has room again, but 1 and 2 are queued: 3 waits behind them.
        socket.lock().unwrap().room = 10;
        out.send(3).unwrap();
        assert!(socket.lock().unwrap().written.is_empty());
        assert_eq!(out.poll_drive(&mut cx), Poll::Ready(Ok(())));
        assert_eq!(socket.lock().unwrap().written, vec![1, 2, 3]);
        // The cap holds while the socket is full.
        socket.lock().unwrap().room = 0;
        for i in 4..7 {
            out.send(i).unwrap();
        }
        assert_eq!(out.send(7), Err(Refused::Full));
        assert_eq!(out.queue.len(), 3);
        assert!(
            out.poll_drive(&mut cx).is_pending(),
            "still waiting for room"
        );
    }

    #[test]
    fn parts_are_written_at_once_only_with_nothing_queued_before_them() {
        let (mut out, socket, _, waker) = setup(0);
        let mut cx = Context::from_waker(&waker);
        assert!(out.poll_drive(&mut cx).is_ready());
        // A full socket: the frame is made and queued.
        let mut made = 0;
        out.send_parts(&["1"], || {
            made += 1;
            1
        })
        .unwrap();
        assert_eq!((made, out.queue.len()), (1, 1));
        // Room again, but 1 is queued: 2 must not overtake it.
        socket.lock().unwrap().room = 10;
        out.send_parts(&["2"], || 2).unwrap();
        assert!(socket.lock().unwrap().written.is_empty());
        assert_eq!(out.poll_drive(&mut cx), Poll::Ready(Ok(())));
        assert_eq!(socket.lock().unwrap().written, vec![1, 2]);
        // Nothing queued: written from the parts, never made.
        out.send_parts(&["3", "4"], || unreachable!("written from its parts"))
            .unwrap();
        assert_eq!(socket.lock().unwrap().written, vec![1, 2, 34]);
        // Kept by the sink: the writer task's turn flushes it.
        socket.lock().unwrap().stuck = true;
        out.send_parts(&["5"], || unreachable!()).unwrap();
        socket.lock().unwrap().stuck = false;
        assert_eq!(out.poll_drive(&mut cx), Poll::Ready(Ok(())));
        assert_eq!(socket.lock().unwrap().written, vec![1, 2, 34, 5]);
        // A failing sink breaks the socket.
        assert!(matches!(out.send_parts(&["x"], || 0), Err(Refused::Broken)));
        assert!(matches!(out.poll_drive(&mut cx), Poll::Ready(Err(_))));
    }

    #[test]
    fn the_writer_task_flushes_only_what_a_sender_left_unflushed() {
        let (mut out, socket, _, waker) = setup(10);
        let mut cx = Context::from_waker(&waker);
        assert!(out.poll_drive(&mut cx).is_ready());
        out.send(1).unwrap();
        let flushes = socket.lock().unwrap().flushes;
        // Nothing queued, nothing left in the sink: the writer task's turn costs no flush.
        assert_eq!(out.poll_drive(&mut cx), Poll::Ready(Ok(())));
        assert_eq!(socket.lock().unwrap().flushes, flushes);
        // A sender's flush that could not finish is finished by the writer task.
        socket.lock().unwrap().stuck = true;
        out.send(2).unwrap();
        assert_eq!(socket.lock().unwrap().written, vec![1]);
        assert!(out.poll_drive(&mut cx).is_pending());
        socket.lock().unwrap().stuck = false;
        assert_eq!(out.poll_drive(&mut cx), Poll::Ready(Ok(())));
        assert_eq!(socket.lock().unwrap().written, vec![1, 2]);
    }

    #[test]
    fn a_failed_socket_refuses_later_frames_and_tells_its_owner() {
        let (mut out, socket, count, waker) = setup(10);
        assert!(out.poll_drive(&mut Context::from_waker(&waker)).is_ready());
        socket.lock().unwrap().fail = true;
        assert_eq!(out.send(1), Err(Refused::Broken));
        assert_eq!(*count.0.lock().unwrap(), 1, "the writer task is told");
        assert_eq!(out.send(2), Err(Refused::Broken));
        assert_eq!(
            out.poll_drive(&mut Context::from_waker(&waker)),
            Poll::Ready(Err("reset".into()))
        );
    }

    /// A real socket (a 64-byte pipe): frames that do not fit are finished by the writer
    /// task, in order, while the owner only waits on [`Broken`].
    mod with_a_socket {
        use super::super::*;
        use crate::wsframe::{Frame, FrameReader, FrameWriter, Out, Role};
        use tokio::io::DuplexStream;

        type Pipe = FrameWriter<DuplexStream>;
        const BOUND: Duration = Duration::from_secs(10);

        fn pipe() -> (Pipe, FrameReader<DuplexStream>) {
            let (ours, theirs) = tokio::io::duplex(64);
            let reader = FrameReader::new(theirs, Role::Client, 1 << 20, &[]);
            (FrameWriter::new(ours, Role::Server), reader)
        }

        async fn read_text(r: &mut FrameReader<DuplexStream>) -> Option<String> {
            match tokio::time::timeout(BOUND, r.next())
                .await
                .expect("a frame in time")
            {
                Ok(Some(Frame::Text(t))) => Some(t.to_owned()),
                Ok(Some(Frame::Close(c))) => Some(format!("close {c:?}")),
                _ => None,
            }
        }

        #[tokio::test]
        async fn frames_a_socket_cannot_take_at_once_arrive_in_order() {
            let out = SharedWriter::<Pipe, Out>::default();
            let (sink, mut reader) = pipe();
            let _broken = out.install(sink, 16, &TaskTracker::new());
            let sent: Vec<String> = (0..5).map(|i| format!("{i}{}", "x".repeat(100))).collect();
            for t in &sent {
                out.send(Out::Text(t.clone())).unwrap();
            }
            for t in &sent {
                assert_eq!(read_text(&mut reader).await.as_deref(), Some(&t[..]));
            }
        }

        #[tokio::test]
        async fn a_failed_write_is_told_to_the_owner_and_later_frames_are_refused() {
            let out = SharedWriter::<Pipe, Out>::default();
            let (sink, reader) = pipe();
            let broken = out.install(sink, 16, &TaskTracker::new());
            drop(reader);
            // A frame the pipe cannot take: its write fails (now, or in the writer task).
            let _ = out.send(Out::Text("y".repeat(200)));
            let why = tokio::time::timeout(BOUND, broken.failed())
                .await
                .expect("told in time");
            assert!(!why.is_empty());
            assert_eq!(out.send(Out::Text("late".into())), Err(Refused::Broken));
        }

        #[tokio::test]
        async fn finish_lets_the_queue_out_then_the_last_frame_then_closes() {
            let out = SharedWriter::<Pipe, Out>::default();
            let (sink, mut reader) = pipe();
            let _broken = out.install(sink, 16, &TaskTracker::new());
            out.send(Out::Text("z".repeat(150))).unwrap();
            out.send(Out::Text("second".into())).unwrap();
            let reading = tokio::spawn(async move {
                let mut seen = Vec::new();
                while let Some(t) = read_text(&mut reader).await {
                    seen.push(t);
                }
                seen
            });
            assert!(out.finish(Some(Out::Close(1000)), BOUND).await);
            let seen = tokio::time::timeout(BOUND, reading).await.unwrap().unwrap();
            assert_eq!(
                seen,
                vec!["z".repeat(150), "second".into(), "close Some(1000)".into()]
            );
            assert_eq!(out.send(Out::Text("after".into())), Err(Refused::Gone));
            assert!(!out.finish(None, BOUND).await, "nothing left to finish");
        }

        #[tokio::test]
        async fn a_new_socket_replaces_the_old_which_is_closed() {
            let out = SharedWriter::<Pipe, Out>::default();
            let (first, mut old_reader) = pipe();
            let _ = out.install(first, 16, &TaskTracker::new());
            let (second, mut reader) = pipe();
            let _ = out.install(second, 16, &TaskTracker::new());
            out.send(Out::Text("to the new one".into())).unwrap();
            assert_eq!(
                read_text(&mut reader).await.as_deref(),
                Some("to the new one")
            );
            assert_eq!(
                read_text(&mut old_reader).await,
                None,
                "the old socket is closed"
            );
        }
    }
}
