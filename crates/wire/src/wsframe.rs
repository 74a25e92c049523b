//! WebSocket framing (RFC 6455) after the upgrade, for every connection that carries calls.
//!
//! The reader and the writer of every broker-side connection that carries calls (editor links,
//! native and compat sessions).
//!
//! Why not tungstenite's framing: frames borrowed from the read buffer and written as header +
//! payload in one `writev` took the daemon from 21 k to 17.5 k instructions per call
//! (`benches/README.md`, "Tried, kept and dropped").
//!
//! The reader hands out each frame borrowed from its own buffer (unmasked in place, a text
//! frame checked as UTF-8 there), so a frame costs no allocation and no copy on its way in;
//! only a fragmented message is put together in a buffer of its own. The writer sends each
//! frame's payload from the sender's own buffer, behind its header, in one vectored write.
//! Both work on split socket halves, so reading and writing never take a lock. No extension
//! is ever agreed (the handshakes offer none), so a frame with a reserved bit set is refused.
//!
//! A reader given a share of the budget for messages in flight ([`FrameReader::with_budget`],
//! `wire::budget`) claims a long frame's bytes from its header, before it reads the payload;
//! a frame the budget cannot take is read past in small pieces (its id picked out on the way,
//! `wire::idscan`), [`Error::OverBudget`] says so, and the reader reads on. Once a long frame
//! is dropped its buffer shrinks back and the claim is given back.
//!
//! The handshakes are elsewhere: hyper's on the doors (`frontdoor`), `wsupgrade` on editor
//! links. The test kit's peers are tungstenite, which checks this module against another
//! implementation in every suite test.

use super::budget::{Claim, Share};
use super::idscan::IdScan;
use super::Error;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::io::AsyncRead;

/// Which end of the connection this is: a client masks every frame it sends, a server
/// requires every frame it reads to be masked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The broker dialled (an editor link).
    Client,
    /// The peer dialled (a session).
    Server,
}

/// One frame (or reassembled message), borrowed from the reader until its next read.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// A text message.
    Text(&'a str),
    /// A binary message.
    Binary(&'a [u8]),
    /// A ping; the owner answers it with [`Out::Pong`].
    Ping(&'a [u8]),
    /// A pong.
    Pong(&'a [u8]),
    /// The peer is closing, with its status code if it gave one.
    Close(Option<u16>),
}

/// A frame to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Out {
    /// A text message, in one frame.
    Text(String),
    /// A ping with this payload (at most 125 bytes).
    Ping(Vec<u8>),
    /// A pong echoing a ping's payload (at most 125 bytes).
    Pong(Vec<u8>),
    /// A close frame with this status code; nothing may follow it.
    Close(u16),
}

const OP_CONTINUATION: u8 = 0;
const OP_TEXT: u8 = 1;
const OP_BINARY: u8 = 2;
const OP_CLOSE: u8 = 8;
const OP_PING: u8 = 9;
const OP_PONG: u8 = 10;

/// The read buffer a connection starts with (and returns to once a long frame is read):
/// JSON-RPC frames are mostly a few hundred bytes, and 1000 sessions hold 1000 of these. A
/// frame that fits it is never counted against the budget for messages in flight.
const READ_CHUNK: usize = super::budget::FREE;

/// A frame header, parsed.
#[derive(Debug, PartialEq, Eq)]
struct Header {
    fin: bool,
    op: u8,
    mask: Option<[u8; 4]>,
    len: u64,
    /// Bytes of the header itself.
    size: usize,
}

/// Parses the header at the start of `b`: `Ok(None)` while it is incomplete.
fn parse_header(b: &[u8], role: Role) -> Result<Option<Header>, Error> {
    let (Some(&b0), Some(&b1)) = (b.first(), b.get(1)) else {
        return Ok(None);
    };
    if b0 & 0x70 != 0 {
        return Err(Error::Protocol(
            "a reserved bit is set (no extension was agreed)",
        ));
    }
    let fin = b0 & 0x80 != 0;
    let op = b0 & 0x0f;
    let masked = b1 & 0x80 != 0;
    let len7 = b1 & 0x7f;
    let ext = match len7 {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    let size = 2 + ext + if masked { 4 } else { 0 };
    let Some(rest) = b.get(2..size) else {
        return Ok(None);
    };
    let (len_bytes, mask_bytes) = rest.split_at(ext);
    let len = match len7 {
        126 => u64::from(u16::from_be_bytes([len_bytes[0], len_bytes[1]])),
        127 => {
            let mut a = [0u8; 8];
            a.copy_from_slice(len_bytes);
            let len = u64::from_be_bytes(a);
            if len >> 63 != 0 {
                return Err(Error::Protocol("a frame length has its top bit set"));
            }
            len
        }
        n => u64::from(n),
    };
    match op {
        OP_CONTINUATION | OP_TEXT | OP_BINARY => {}
        OP_CLOSE | OP_PING | OP_PONG => {
            if !fin {
                return Err(Error::Protocol("a control frame is fragmented"));
            }
            if len > 125 {
                return Err(Error::Protocol("a control frame is longer than 125 bytes"));
            }
        }
        _ => return Err(Error::Protocol("unknown opcode")),
    }
    let mask = match (role, masked) {
        (Role::Server, false) => return Err(Error::Protocol("a client frame is not masked")),
        (Role::Client, true) => return Err(Error::Protocol("a server frame is masked")),
        (_, true) => Some([mask_bytes[0], mask_bytes[1], mask_bytes[2], mask_bytes[3]]),
        (_, false) => None,
    };
    Ok(Some(Header {
        fin,
        op,
        mask,
        len,
        size,
    }))
}

/// XORs `data` with `key` repeated, eight bytes at a time (masking and unmasking alike).
fn apply_mask(data: &mut [u8], key: [u8; 4]) {
    let k = u64::from_ne_bytes([
        key[0], key[1], key[2], key[3], key[0], key[1], key[2], key[3],
    ]);
    let mut chunks = data.chunks_exact_mut(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        c.copy_from_slice(&(u64::from_ne_bytes(w) ^ k).to_ne_bytes());
    }
    // The remainder starts at a multiple of 8, so the key's phase is 0 there.
    for (i, b) in chunks.into_remainder().iter_mut().enumerate() {
        *b ^= key[i & 3];
    }
}

/// Where the frame handed out last is, so the next read can drop it.
#[derive(Debug, Clone, Copy)]
enum Last {
    Nothing,
    /// In the read buffer: its payload at `start..end`; the frame ends at `end`.
    InPlace {
        op: u8,
        start: usize,
        end: usize,
    },
    /// Put together from fragments in `message`.
    Assembled {
        op: u8,
    },
}

/// A message refused for want of budget, being read past.
struct Skip {
    /// Payload bytes of the current frame not read yet.
    left: u64,
    /// The current frame's masking key, turned to the next byte's place in it.
    mask: Option<[u8; 4]>,
    /// The current frame is the message's last.
    fin: bool,
    /// The message's length so far (its frames' announced lengths).
    size: u64,
    /// Its id, looked for in the bytes as they pass.
    id: IdScan,
}

/// The read half: frames from `io`, each borrowed until the next read.
pub struct FrameReader<R> {
    io: R,
    role: Role,
    /// The longest message taken.
    max: usize,
    /// The bytes read (its length; a read fills its spare capacity, never zeroed first); the
    /// unread ones are `head..`.
    buf: Vec<u8>,
    head: usize,
    last: Last,
    /// A fragmented message being put together: its opcode and its payload so far.
    message: Option<(u8, Vec<u8>)>,
    /// How much of a fragmented text message is known to be UTF-8 (checked as each fragment
    /// comes, so a bad byte is refused at once, not after up to `max` bytes are buffered).
    message_checked: usize,
    /// What it holds of the budget for messages in flight; `None`: outside it (an editor link).
    claim: Option<Claim>,
    /// A message refused for want of budget, being read past.
    skip: Option<Box<Skip>>,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// A reader over `io` for a connection in `role`, taking messages up to `max` bytes;
    /// `read_ahead` are bytes already read from `io` past the handshake.
    pub fn new(io: R, role: Role, max: usize, read_ahead: &[u8]) -> Self {
        let mut buf = Vec::with_capacity(READ_CHUNK.max(read_ahead.len()));
        buf.extend_from_slice(read_ahead);
        FrameReader {
            io,
            role,
            max,
            buf,
            head: 0,
            last: Last::Nothing,
            message: None,
            message_checked: 0,
            claim: None,
            skip: None,
        }
    }

    /// Puts the reader's long messages under `share` of the budget for messages in flight: a
    /// frame longer than the read buffer is claimed from its header before its payload is
    /// read; one the budget cannot take is read past, never held, and [`Self::next`] returns
    /// [`Error::OverBudget`] for it, after which it reads on.
    pub fn with_budget(mut self, share: Share) -> Self {
        self.claim = Some(share.claim());
        self
    }

    /// The next frame. `Ok(None)` once the peer closed the socket between frames. Cancel
    /// safe: dropped before it is ready, it loses nothing. Every error ends the connection
    /// but [`Error::OverBudget`] (a reader [`Self::with_budget`]): after it, it reads on.
    pub async fn next(&mut self) -> Result<Option<Frame<'_>>, Error> {
        if !std::future::poll_fn(|cx| self.poll_frame(cx)).await? {
            return Ok(None);
        }
        self.frame().map(Some)
    }

    /// True when bytes past the frame handed out last are already read (the next frame, or
    /// part of it): the socket has not been drained.
    pub fn more_buffered(&self) -> bool {
        match self.last {
            Last::InPlace { end, .. } => self.buf.len() > end,
            _ => self.buf.len() > self.head,
        }
    }

    /// The frame handed out last, as [`Frame`].
    fn frame(&self) -> Result<Frame<'_>, Error> {
        let (op, payload) = match self.last {
            Last::Nothing => return Err(Error::Protocol("no frame")),
            Last::InPlace { op, start, end } => (op, &self.buf[start..end]),
            Last::Assembled { op } => (
                op,
                self.message.as_ref().map_or(&[][..], |(_, m)| m.as_slice()),
            ),
        };
        Ok(match op {
            OP_TEXT => Frame::Text(std::str::from_utf8(payload).map_err(|_| Error::NotUtf8)?),
            OP_BINARY => Frame::Binary(payload),
            OP_PING => Frame::Ping(payload),
            OP_PONG => Frame::Pong(payload),
            _ => match payload {
                [] => Frame::Close(None),
                [hi, lo, reason @ ..] => {
                    if std::str::from_utf8(reason).is_err() {
                        return Err(Error::NotUtf8);
                    }
                    let code = u16::from_be_bytes([*hi, *lo]);
                    if !close_code_allowed(code) {
                        return Err(Error::Protocol("a close code that may not be sent"));
                    }
                    Frame::Close(Some(code))
                }
                [_] => return Err(Error::Protocol("a close frame with a 1-byte payload")),
            },
        })
    }

    /// Drops the frame handed out last; once a whole message is dropped, gives back what it
    /// held of the budget.
    fn release(&mut self) {
        let handed_out = match std::mem::replace(&mut self.last, Last::Nothing) {
            Last::Nothing => false,
            Last::InPlace { end, .. } => {
                self.head = end;
                true
            }
            Last::Assembled { .. } => {
                self.message = None;
                true
            }
        };
        if self.head == self.buf.len() {
            self.head = 0;
            self.buf.clear();
            // A long frame grew it: 1000 idle sessions should not each keep one.
            self.buf.shrink_to(READ_CHUNK);
        }
        // Not on a control frame in the middle of a message, nor on a poll that found the
        // frame still coming (nothing was handed out): its claim stands.
        if handed_out && self.message.is_none() && self.claim.as_ref().is_some_and(|c| c.held() > 0)
        {
            self.compact();
            if let Some(c) = &mut self.claim {
                c.release();
            }
        }
    }

    /// Drops the bytes before `head` and shrinks the buffer to what is left (at least
    /// [`READ_CHUNK`]): the memory a long frame took is given back, not kept as capacity.
    fn compact(&mut self) {
        self.buf.drain(..self.head);
        self.head = 0;
        self.buf.shrink_to(READ_CHUNK.max(self.buf.len()));
    }

    /// Reads until a whole frame (or message) is at hand and records it in `last`.
    /// `Ready(Ok(false))` at a clean end of the stream; [`Error::OverBudget`] once a message
    /// the budget refused has been read past.
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Result<bool, Error>> {
        self.release();
        loop {
            if self.skip.is_some() {
                match self.skip_buffered() {
                    SkipStep::Done(e) => return Poll::Ready(Err(e)),
                    SkipStep::NextHeader => {}
                    SkipStep::MoreBytes => {
                        if !ready!(self.poll_fill(cx, 1))? {
                            return Poll::Ready(Err(mid_message_eof()));
                        }
                        continue;
                    }
                }
            }
            let unread = self.buf.len() - self.head;
            let need = match parse_header(&self.buf[self.head..], self.role)? {
                None => 14, // the longest header: read until it is all there
                Some(h) => {
                    let data = matches!(h.op, OP_TEXT | OP_BINARY | OP_CONTINUATION);
                    if data && self.skip.is_some() {
                        self.skip_next_frame(&h)?;
                        continue;
                    }
                    let so_far = self.message.as_ref().map_or(0, |(_, m)| m.len() as u64);
                    if data && so_far.saturating_add(h.len) > self.max as u64 {
                        return Poll::Ready(Err(Error::TooBig {
                            size: so_far.saturating_add(h.len),
                            max: self.max,
                        }));
                    }
                    // Within `max` (a data frame) or 125 bytes (a control frame): fits usize.
                    let total = h.size + h.len as usize;
                    if data && !self.claim_for(&h, total) {
                        self.refuse(&h, so_far + h.len);
                        continue;
                    }
                    if unread >= total {
                        if self.take(h)? {
                            return Poll::Ready(Ok(true));
                        }
                        continue;
                    }
                    total
                }
            };
            if need <= READ_CHUNK && self.buf.capacity() > READ_CHUNK {
                // Waiting for a short frame (or a header) with a buffer a long one grew (the
                // frames read with it are all handed out): it shrinks back before the wait,
                // so a peer that stops here keeps nothing of it.
                self.compact();
            }
            if !ready!(self.poll_fill(cx, need))? {
                if self.head == self.buf.len() && self.message.is_none() && self.skip.is_none() {
                    return Poll::Ready(Ok(false));
                }
                return Poll::Ready(Err(mid_message_eof()));
            }
        }
    }

    /// Whether the frame `h` (`total` bytes with its header) may be read: always without a
    /// budget, or when it fits the read buffer; else when the budget takes what the reader
    /// will hold with it: the frame, and if it joins a fragmented message, the buffer the
    /// fragments came through and the message's room. (A claim only grows until the message
    /// is handed out and dropped.)
    fn claim_for(&mut self, h: &Header, total: usize) -> bool {
        if self.claim.is_none() {
            return true;
        }
        let need = if !h.fin || h.op == OP_CONTINUATION {
            self.buf.capacity().max(total) + self.message_room(h.len as usize)
        } else {
            total
        };
        need <= READ_CHUNK || self.claim.as_mut().is_some_and(|c| c.hold(need))
    }

    /// The capacity the message being put together will have once `add` more bytes join it:
    /// doubled as it grows (as `Vec` would), within `max`, so that its claim is known before
    /// the bytes are read.
    fn message_room(&self, add: usize) -> usize {
        match &self.message {
            None => add,
            Some((_, m)) if m.len() + add <= m.capacity() => m.capacity(),
            Some((_, m)) => (m.len() + add).max(m.capacity() * 2).min(self.max),
        }
    }

    /// Refuses the message that the data frame `h` at `head` starts or continues (`size`
    /// bytes so far, this frame's with them): what was put together of it is dropped and the
    /// claim given back, and the rest of it is read past.
    fn refuse(&mut self, h: &Header, size: u64) {
        let mut id = IdScan::default();
        if let Some((_, m)) = self.message.take() {
            id.feed(&m);
        }
        self.message_checked = 0;
        self.head += h.size;
        if let Some(c) = &mut self.claim {
            c.budget().note_refusal(size);
            c.release();
        }
        self.skip = Some(Box::new(Skip {
            left: h.len,
            mask: h.mask,
            fin: h.fin,
            size,
            id,
        }));
    }

    /// Reads past what is buffered of the refused message's current frame.
    fn skip_buffered(&mut self) -> SkipStep {
        let Some(skip) = self.skip.as_deref_mut() else {
            return SkipStep::NextHeader;
        };
        let buffered = self.buf.len() - self.head;
        let here = usize::try_from(skip.left).map_or(buffered, |left| left.min(buffered));
        if here > 0 {
            let bytes = &mut self.buf[self.head..self.head + here];
            if let Some(mut key) = skip.mask {
                apply_mask(bytes, key);
                key.rotate_left(here % 4);
                skip.mask = Some(key);
            }
            skip.id.feed(bytes);
            self.head += here;
            skip.left -= here as u64;
        }
        if skip.left > 0 {
            // Everything read is read past: the buffer starts over, and stays small.
            self.head = 0;
            self.buf.clear();
            self.buf.shrink_to(READ_CHUNK);
            return SkipStep::MoreBytes;
        }
        if !skip.fin {
            return SkipStep::NextHeader;
        }
        let done = self.skip.take();
        if self.buf.capacity() > READ_CHUNK {
            self.compact();
        }
        match done {
            Some(skip) => SkipStep::Done(Error::OverBudget {
                size: skip.size,
                id: skip.id.id(),
            }),
            None => SkipStep::NextHeader,
        }
    }

    /// The refused message goes on with the data frame `h` at `head`: it is read past too.
    fn skip_next_frame(&mut self, h: &Header) -> Result<(), Error> {
        let Some(skip) = self.skip.as_deref_mut() else {
            return Ok(());
        };
        if h.op != OP_CONTINUATION {
            return Err(Error::Protocol("a new message inside a fragmented one"));
        }
        skip.size = skip.size.saturating_add(h.len);
        if skip.size > self.max as u64 {
            return Err(Error::TooBig {
                size: skip.size,
                max: self.max,
            });
        }
        skip.left = h.len;
        skip.mask = h.mask;
        skip.fin = h.fin;
        self.head += h.size;
        Ok(())
    }

    /// A whole frame is at `head`: unmasks it and either records it as the frame to hand out
    /// (true) or adds it to the fragmented message (false).
    fn take(&mut self, h: Header) -> Result<bool, Error> {
        let start = self.head + h.size;
        let end = start + h.len as usize;
        if let Some(key) = h.mask {
            apply_mask(&mut self.buf[start..end], key);
        }
        let op = h.op;
        if op >= OP_CLOSE || (h.fin && op != OP_CONTINUATION) {
            if op < OP_CLOSE && self.message.is_some() {
                return Err(Error::Protocol("a new message inside a fragmented one"));
            }
            self.last = Last::InPlace { op, start, end };
            return Ok(true);
        }
        let room = self.message_room(end - start);
        let payload = &self.buf[start..end];
        match (&mut self.message, op) {
            (None, OP_CONTINUATION) => {
                return Err(Error::Protocol(
                    "a continuation frame with no message to continue",
                ))
            }
            (None, _) => {
                self.message = Some((op, payload.to_vec()));
                self.message_checked = 0;
            }
            (Some(_), OP_TEXT | OP_BINARY) => {
                return Err(Error::Protocol("a new message inside a fragmented one"))
            }
            (Some((_, m)), _) => {
                // Grown to the room its claim was made for.
                m.reserve_exact(room - m.len());
                m.extend_from_slice(payload);
            }
        }
        self.head = end;
        if let Some((OP_TEXT, m)) = &self.message {
            self.message_checked = utf8_checked_up_to(m, self.message_checked)?;
        }
        if h.fin {
            let op = self.message.as_ref().map_or(OP_BINARY, |(op, _)| *op);
            self.last = Last::Assembled { op };
            return Ok(true);
        }
        Ok(false)
    }

    /// Reads more from the socket, with room for `need` unread bytes at least. `Ok(false)` at
    /// the end of the stream.
    fn poll_fill(&mut self, cx: &mut Context<'_>, need: usize) -> Poll<io::Result<bool>> {
        let room = self.buf.capacity();
        if room - self.head < need || self.buf.len() == room {
            self.buf.drain(..self.head);
            self.head = 0;
            if self.buf.len() == room {
                // Grown as the bytes come, not to the size a header announces: a peer that
                // announces 64 MiB and sends nothing costs nothing.
                let grown = (room * 2).min(need).max(room + 1);
                self.buf.reserve_exact(grown - self.buf.len());
            }
        }
        // Into the spare capacity, uninitialised: a long frame's buffer is not zeroed first.
        let n = ready!(tokio_util::io::poll_read_buf(
            Pin::new(&mut self.io),
            cx,
            &mut self.buf
        ))?;
        Poll::Ready(Ok(n > 0))
    }
}

/// What reading past a refused message came to.
enum SkipStep {
    /// All of it is read past: the error that says so.
    Done(Error),
    /// Its current frame is read past and another of it follows (or it is done already).
    NextHeader,
    /// More of its current frame is to come.
    MoreBytes,
}

/// The error for a stream that ends in the middle of a frame or a message.
fn mid_message_eof() -> Error {
    Error::Io(io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the connection closed in the middle of a message",
    ))
}

/// Close codes a peer may send (RFC 6455 §7.4, as tungstenite decides): the defined ones that
/// may appear on the wire, 1012 and 1013 (registered since), and the ranges for libraries
/// (3000–3999) and applications (4000–4999). 1005, 1006 and 1015 are for reporting only.
pub fn close_code_allowed(code: u16) -> bool {
    matches!(code, 1000..=1003 | 1007..=1013 | 3000..=4999)
}

/// Checks `text[from..]` as UTF-8, allowing it to end in the middle of a sequence (the next
/// fragment completes it); returns how far it is known good.
fn utf8_checked_up_to(text: &[u8], from: usize) -> Result<usize, Error> {
    match std::str::from_utf8(&text[from..]) {
        Ok(_) => Ok(text.len()),
        Err(e) if e.error_len().is_none() => Ok(from + e.valid_up_to()),
        Err(_) => Err(Error::NotUtf8),
    }
}

mod writer;
pub use writer::FrameWriter;

#[cfg(test)]
mod tests;
