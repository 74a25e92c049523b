//! The write half of an editor link, shared by every task that sends upstream.
//!
//! A frame is written to the socket by the sending task itself when the link is idle (nothing
//! queued, the socket takes it at once), so a call wakes no writer task on its way to the
//! editor. Otherwise it is queued, and the link task, woken, writes the queue in order. A frame
//! is written directly only when nothing is queued before it, so frames reach the editor in the
//! order they were sent.

use crate::sync::lock;
use futures_util::{Sink, SinkExt};
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

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

/// The write half of a link: its sink, the frames waiting for it, and the link task's waker.
pub struct LinkOut<S, T> {
    sink: S,
    queue: VecDeque<T>,
    cap: usize,
    /// The link task's waker, known once it has driven this once.
    waker: Option<Waker>,
    /// The socket failed (the error, for the link task to report).
    broken: Option<String>,
    /// A flush did not finish: the sink holds bytes the link task must flush when the socket
    /// has room. Without it, the link task's turn has nothing to do.
    unflushed: bool,
}

impl<S, T> LinkOut<S, T>
where
    S: Sink<T> + Unpin,
    S::Error: std::fmt::Display,
{
    /// A write half over `sink` holding at most `cap` queued frames.
    pub fn new(sink: S, cap: usize) -> Self {
        LinkOut {
            sink,
            queue: VecDeque::new(),
            cap,
            waker: None,
            broken: None,
            unflushed: false,
        }
    }

    /// Sends `frame`: written now if nothing is queued and the socket takes it, else queued
    /// for the link task. Never waits.
    pub fn send(&mut self, frame: T) -> Result<(), Refused> {
        if self.broken.is_some() {
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
    pub fn send_parts(&mut self, parts: &[&str], make: impl FnOnce() -> T) -> Result<(), Refused>
    where
        S: WriteParts,
    {
        if self.broken.is_some() {
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
                    self.broken = Some(e);
                    waker.wake_by_ref();
                    return Err(Refused::Broken);
                }
            }
        }
        self.enqueue(make())
    }

    /// Queues `frame` for the link task (it cannot be written now), unless the queue is full.
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

    /// Writes one frame with the link task's waker (a write the socket cannot finish now is
    /// finished by the link task when the socket wakes it). Gives the frame back when the sink
    /// is not ready; `Err(None)` when the socket failed.
    fn write_now(&mut self, frame: T, waker: &Waker) -> Result<(), Option<T>> {
        let mut cx = Context::from_waker(waker);
        let fail = |me: &mut Self, e: S::Error| {
            me.broken = Some(e.to_string());
            waker.wake_by_ref();
        };
        match Pin::new(&mut self.sink).poll_ready(&mut cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(e)) => {
                fail(self, e);
                return Err(None);
            }
            Poll::Pending => return Err(Some(frame)),
        }
        if let Err(e) = Pin::new(&mut self.sink).start_send(frame) {
            fail(self, e);
            return Err(None);
        }
        match Pin::new(&mut self.sink).poll_flush(&mut cx) {
            Poll::Ready(Err(e)) => {
                fail(self, e);
                Err(None)
            }
            Poll::Ready(Ok(())) => Ok(()),
            // The rest is written when the socket wakes the link task.
            Poll::Pending => {
                self.unflushed = true;
                Ok(())
            }
        }
    }

    /// The link task's turn: remembers its waker, writes the queue and flushes. `Ready(Ok)`
    /// once everything is on the socket, `Ready(Err)` once the socket failed, `Pending` while
    /// the socket is full (the link task is woken when it has room).
    pub fn poll_drive(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), String>> {
        if !self.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            self.waker = Some(cx.waker().clone());
        }
        if let Some(e) = &self.broken {
            return Poll::Ready(Err(e.clone()));
        }
        if self.queue.is_empty() && !self.unflushed {
            return Poll::Ready(Ok(()));
        }
        while !self.queue.is_empty() {
            match Pin::new(&mut self.sink).poll_ready(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return self.failed(e),
                Poll::Pending => return Poll::Pending,
            }
            if let Some(frame) = self.queue.pop_front() {
                if let Err(e) = Pin::new(&mut self.sink).start_send(frame) {
                    return self.failed(e);
                }
            }
        }
        match Pin::new(&mut self.sink).poll_flush(cx) {
            Poll::Ready(Err(e)) => self.failed(e),
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

    fn failed(&mut self, e: S::Error) -> Poll<Result<(), String>> {
        let e = e.to_string();
        self.broken = Some(e.clone());
        Poll::Ready(Err(e))
    }

    /// Frames still queued.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Writes what is queued, then closes the sink, within `limit` (a peer that does not
    /// read gets no longer than that).
    pub async fn finish(mut self, limit: Duration) {
        let _ = tokio::time::timeout(limit, async move {
            if std::future::poll_fn(|cx| self.poll_drive(cx)).await.is_ok() {
                let _ = self.sink.close().await;
            }
        })
        .await;
    }
}

/// A [`LinkOut`] shared by the tasks that send on one socket (behind a lock held only for a
/// non-blocking write); empty while there is no socket.
pub struct Shared<S, T>(Mutex<Option<LinkOut<S, T>>>);

impl<S, T> Shared<S, T>
where
    S: Sink<T> + Unpin,
    S::Error: std::fmt::Display,
{
    /// Shared over `out`, or empty.
    pub fn new(out: Option<LinkOut<S, T>>) -> Self {
        Shared(Mutex::new(out))
    }

    /// Puts a (new) socket in place.
    pub fn install(&self, out: LinkOut<S, T>) {
        *lock(&self.0) = Some(out);
    }

    /// [`LinkOut::send`], or [`Refused::Gone`] when there is no socket.
    pub fn send(&self, frame: T) -> Result<(), Refused> {
        lock(&self.0)
            .as_mut()
            .map_or(Err(Refused::Gone), |o| o.send(frame))
    }

    /// [`LinkOut::send_parts`], or [`Refused::Gone`] when there is no socket.
    pub fn send_parts(&self, parts: &[&str], make: impl FnOnce() -> T) -> Result<(), Refused>
    where
        S: WriteParts,
    {
        lock(&self.0)
            .as_mut()
            .map_or(Err(Refused::Gone), |o| o.send_parts(parts, make))
    }

    /// The owning task's turn in its `select!`: writes what is queued. `Ready` only with the
    /// error once the socket failed.
    pub fn poll_broken(&self, cx: &mut Context<'_>) -> Poll<String> {
        match lock(&self.0).as_mut().map(|o| o.poll_drive(cx)) {
            Some(Poll::Ready(Err(e))) => Poll::Ready(e),
            _ => Poll::Pending,
        }
    }

    /// Takes the socket out (the connection is ending): later sends get [`Refused::Gone`].
    pub fn take(&self) -> Option<LinkOut<S, T>> {
        lock(&self.0).take()
    }
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
    struct Shared(Arc<Mutex<Socket>>);
    impl Sink<u32> for Shared {
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
    impl WriteParts for Shared {
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

    fn setup(room: usize) -> (LinkOut<Shared, u32>, Arc<Mutex<Socket>>, Arc<Count>, Waker) {
        let socket = Arc::new(Mutex::new(Socket {
            room,
            ..Default::default()
        }));
        let out = LinkOut::new(Shared(socket.clone()), 3);
        let count = Arc::new(Count(Mutex::new(0)));
        let waker = Waker::from(count.clone());
        (out, socket, count, waker)
    }

    #[test]
    fn an_idle_link_is_written_by_the_sender_without_waking_the_link_task() {
        let (mut out, socket, count, waker) = setup(10);
        // Before the link task has driven it once, frames wait for it.
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
        assert_eq!(out.queued(), 0);
        assert_eq!(*count.0.lock().unwrap(), 0, "no wake-up for a direct write");
    }

    #[test]
    fn a_full_socket_queues_in_order_and_the_link_task_writes_the_rest() {
        let (mut out, socket, count, waker) = setup(0);
        let mut cx = Context::from_waker(&waker);
        assert!(out.poll_drive(&mut cx).is_ready(), "nothing to write yet");
        out.send(1).unwrap();
        out.send(2).unwrap();
        assert!(socket.lock().unwrap().written.is_empty());
        assert!(*count.0.lock().unwrap() >= 1, "the link task was woken");
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
        assert_eq!(out.queued(), 3);
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
        assert_eq!((made, out.queued()), (1, 1));
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
        // Kept by the sink: the link task's turn flushes it.
        socket.lock().unwrap().stuck = true;
        out.send_parts(&["5"], || unreachable!()).unwrap();
        socket.lock().unwrap().stuck = false;
        assert_eq!(out.poll_drive(&mut cx), Poll::Ready(Ok(())));
        assert_eq!(socket.lock().unwrap().written, vec![1, 2, 34, 5]);
        // A failing sink breaks the link.
        assert!(matches!(out.send_parts(&["x"], || 0), Err(Refused::Broken)));
        assert!(matches!(out.poll_drive(&mut cx), Poll::Ready(Err(_))));
    }

    #[test]
    fn the_link_task_flushes_only_what_a_sender_left_unflushed() {
        let (mut out, socket, _, waker) = setup(10);
        let mut cx = Context::from_waker(&waker);
        assert!(out.poll_drive(&mut cx).is_ready());
        out.send(1).unwrap();
        let flushes = socket.lock().unwrap().flushes;
        // Nothing queued, nothing left in the sink: the link task's turn costs no flush.
        assert_eq!(out.poll_drive(&mut cx), Poll::Ready(Ok(())));
        assert_eq!(socket.lock().unwrap().flushes, flushes);
        // A sender's flush that could not finish is finished by the link task.
        socket.lock().unwrap().stuck = true;
        out.send(2).unwrap();
        assert_eq!(socket.lock().unwrap().written, vec![1]);
        assert!(out.poll_drive(&mut cx).is_pending());
        socket.lock().unwrap().stuck = false;
        assert_eq!(out.poll_drive(&mut cx), Poll::Ready(Ok(())));
        assert_eq!(socket.lock().unwrap().written, vec![1, 2]);
    }

    #[test]
    fn a_failed_socket_refuses_later_frames_and_ends_the_link() {
        let (mut out, socket, count, waker) = setup(10);
        assert!(out.poll_drive(&mut Context::from_waker(&waker)).is_ready());
        socket.lock().unwrap().fail = true;
        assert_eq!(out.send(1), Err(Refused::Broken));
        assert_eq!(*count.0.lock().unwrap(), 1, "the link task is told");
        assert_eq!(out.send(2), Err(Refused::Broken));
        assert_eq!(
            out.poll_drive(&mut Context::from_waker(&waker)),
            Poll::Ready(Err("reset".into()))
        );
    }
}
