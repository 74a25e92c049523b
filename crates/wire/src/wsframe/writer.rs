//! The writer half: each frame's header built on the stack and sent with the sender's payload
//! in one vectored write; control frames ahead of queued data; masking for the client role.

use super::{apply_mask, Out, Role, OP_CLOSE, OP_PING, OP_PONG, OP_TEXT};
use futures_util::Sink;
use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::io::AsyncWrite;

/// A frame's header: final, opcode `op`, the payload's length, and the masking key if any.
fn header(op: u8, len: usize, key: Option<[u8; 4]>) -> ([u8; 14], usize) {
    let mask_bit = if key.is_some() { 0x80 } else { 0 };
    let mut head = [0u8; 14];
    head[0] = 0x80 | op;
    let mut head_len = 2;
    if len < 126 {
        head[1] = mask_bit | len as u8;
    } else if let Ok(l) = u16::try_from(len) {
        head[1] = mask_bit | 126;
        head[2..4].copy_from_slice(&l.to_be_bytes());
        head_len = 4;
    } else {
        head[1] = mask_bit | 127;
        head[2..10].copy_from_slice(&(len as u64).to_be_bytes());
        head_len = 10;
    }
    if let Some(key) = key {
        head[head_len..head_len + 4].copy_from_slice(&key);
        head_len += 4;
    }
    (head, head_len)
}

/// Masking keys for a client, drawn from the OS's CSPRNG 64 at a time (RFC 6455 §5.3 wants
/// them unpredictable; a syscall per frame would cost more than the frame).
struct Masks {
    pool: [u8; 256],
    at: usize,
}

impl Masks {
    fn next(&mut self) -> io::Result<[u8; 4]> {
        if self.at + 4 > self.pool.len() {
            getrandom::fill(&mut self.pool).map_err(io::Error::other)?;
            self.at = 0;
        }
        let k = &self.pool[self.at..self.at + 4];
        self.at += 4;
        Ok([k[0], k[1], k[2], k[3]])
    }
}

/// Bytes the writer holds before `poll_ready` waits for the socket to take them.
const HIGH_WATER: usize = 64 * 1024;
/// Frames handed to one vectored write at most.
const BATCH: usize = 16;

/// A frame waiting to be written: its header, and its payload (the sender's own buffer, masked
/// in place for a client).
pub(super) struct Queued {
    head: [u8; 14],
    head_len: usize,
    payload: Vec<u8>,
}

impl Queued {
    fn len(&self) -> usize {
        self.head_len + self.payload.len()
    }
}

/// The write half. A [`Sink`] of [`Out`]: each frame keeps its payload (a text frame's
/// `String`, unmoved) and is written with its header in one vectored write, so nothing is
/// copied and an idle connection holds no write buffer. Closing it sends a close frame (1000,
/// unless one was sent) and shuts the socket's write side down.
pub struct FrameWriter<W> {
    /// The socket's write half (the tests read what was written).
    pub(super) io: W,
    /// Only a client masks.
    masks: Option<Box<Masks>>,
    pub(super) queue: VecDeque<Queued>,
    /// Bytes of the front frame already written.
    written: usize,
    /// Bytes queued and not yet written.
    pub(super) queued: usize,
    close_sent: bool,
}

impl<W: AsyncWrite + Unpin> FrameWriter<W> {
    /// A writer over `io` for a connection in `role`.
    pub fn new(io: W, role: Role) -> Self {
        FrameWriter {
            io,
            masks: (role == Role::Client).then(|| {
                Box::new(Masks {
                    pool: [0; 256],
                    at: 256,
                })
            }),
            queue: VecDeque::new(),
            written: 0,
            queued: 0,
            close_sent: false,
        }
    }

    /// The socket (or buffer) underneath, with whatever was not flushed lost.
    pub fn into_inner(self) -> W {
        self.io
    }

    fn encode(&mut self, op: u8, mut payload: Vec<u8>) -> io::Result<()> {
        let len = payload.len();
        let key = match &mut self.masks {
            Some(masks) => Some(masks.next()?),
            None => None,
        };
        let (head, head_len) = header(op, len, key);
        if let Some(key) = key {
            apply_mask(&mut payload, key);
        }
        self.queued += head_len + len;
        self.queue.push_back(Queued {
            head,
            head_len,
            payload,
        });
        Ok(())
    }

    /// Writes every queued frame, up to [`BATCH`] of them per vectored write.
    fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.queue.is_empty() {
            let mut slices = [io::IoSlice::new(&[]); 2 * BATCH];
            let mut k = 0;
            for (i, q) in self.queue.iter().take(BATCH).enumerate() {
                let from = if i == 0 { self.written } else { 0 };
                let head = &q.head[..q.head_len];
                if from < head.len() {
                    slices[k] = io::IoSlice::new(&head[from..]);
                    slices[k + 1] = io::IoSlice::new(&q.payload);
                } else {
                    slices[k + 1] = io::IoSlice::new(&q.payload[from - head.len()..]);
                }
                k += 2;
            }
            let n = ready!(Pin::new(&mut self.io).poll_write_vectored(cx, &slices[..k]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.queued -= n;
            let mut n = self.written + n;
            while let Some(q) = self.queue.front() {
                if n < q.len() {
                    break;
                }
                n -= q.len();
                self.queue.pop_front();
            }
            self.written = n;
        }
        if self.queue.capacity() > BATCH {
            // A burst grew it: idle sessions should not each keep one.
            self.queue = VecDeque::new();
        }
        Poll::Ready(Ok(()))
    }
}

/// Parts a frame written from borrowed parts may have (with its header, one `writev`).
const MAX_PARTS: usize = 15;

impl<W: AsyncWrite + Unpin> crate::shared_writer::WriteParts for FrameWriter<W> {
    /// A server's frame with nothing queued before it is written from the parts themselves
    /// (header and parts in one vectored write); only what the socket does not take is copied
    /// and kept. Behind queued bytes, masked (a client), or in too many parts, it is declined
    /// (the caller assembles it and sends it through [`Sink`]).
    fn write_parts(
        &mut self,
        cx: &mut Context<'_>,
        parts: &[&str],
    ) -> Result<crate::shared_writer::PartsWritten, String> {
        self.text_parts(cx, parts).map_err(|e| e.to_string())
    }
}

impl<W: AsyncWrite + Unpin> FrameWriter<W> {
    fn text_parts(
        &mut self,
        cx: &mut Context<'_>,
        parts: &[&str],
    ) -> io::Result<crate::shared_writer::PartsWritten> {
        use crate::shared_writer::PartsWritten;
        let done = |r: Poll<io::Result<()>>| match r {
            Poll::Ready(Ok(())) => Ok(PartsWritten::Done),
            Poll::Ready(Err(e)) => Err(e),
            Poll::Pending => Ok(PartsWritten::Kept),
        };
        if !self.queue.is_empty() || self.masks.is_some() || parts.len() > MAX_PARTS {
            return Ok(PartsWritten::Declined);
        }
        if self.close_sent {
            return Err(closing());
        }
        let len = parts.iter().map(|p| p.len()).sum();
        let (head, head_len) = header(OP_TEXT, len, None);
        let mut slices = [io::IoSlice::new(&[]); MAX_PARTS + 1];
        slices[0] = io::IoSlice::new(&head[..head_len]);
        for (slice, part) in slices[1..].iter_mut().zip(parts) {
            *slice = io::IoSlice::new(part.as_bytes());
        }
        let total = head_len + len;
        let (n, pending) =
            match Pin::new(&mut self.io).poll_write_vectored(cx, &slices[..=parts.len()]) {
                Poll::Ready(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
                Poll::Ready(Ok(n)) => (n, false),
                Poll::Ready(Err(e)) => return Err(e),
                Poll::Pending => (0, true),
            };
        if n >= total {
            return done(Pin::new(&mut self.io).poll_flush(cx));
        }
        // The socket took part of it, or none: the rest is kept (copied) and written when the
        // socket wakes the task, before any later frame.
        self.queue.push_back(Queued {
            head,
            head_len,
            payload: parts.concat().into_bytes(),
        });
        self.written = n;
        self.queued += total - n;
        if pending {
            // The socket has the task's waker already.
            return Ok(PartsWritten::Kept);
        }
        // A short write registers no waker: write on until the socket says it is full (and
        // so will wake the task), or takes the rest.
        done(Pin::new(&mut *self).poll_flush(cx))
    }
}

/// The error for a frame after the close frame.
fn closing() -> io::Error {
    io::Error::new(
        io::ErrorKind::BrokenPipe,
        "the WebSocket is closing: nothing may follow its close frame",
    )
}

impl<W: AsyncWrite + Unpin> Sink<Out> for FrameWriter<W> {
    type Error = io::Error;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        if me.queued < HIGH_WATER {
            return Poll::Ready(Ok(()));
        }
        me.poll_write_out(cx)
    }

    fn start_send(self: Pin<&mut Self>, item: Out) -> io::Result<()> {
        let me = self.get_mut();
        if me.close_sent {
            return Err(closing());
        }
        match item {
            Out::Text(t) => me.encode(OP_TEXT, t.into_bytes()),
            Out::Ping(mut p) => {
                p.truncate(125);
                me.encode(OP_PING, p)
            }
            Out::Pong(mut p) => {
                p.truncate(125);
                me.encode(OP_PONG, p)
            }
            Out::Close(code) => {
                me.close_sent = true;
                me.encode(OP_CLOSE, code.to_be_bytes().to_vec())
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        ready!(me.poll_write_out(cx))?;
        Pin::new(&mut me.io).poll_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        if !me.close_sent {
            me.close_sent = true;
            me.encode(OP_CLOSE, 1000u16.to_be_bytes().to_vec())?;
        }
        ready!(me.poll_write_out(cx))?;
        ready!(Pin::new(&mut me.io).poll_flush(cx))?;
        Pin::new(&mut me.io).poll_shutdown(cx)
    }
}
