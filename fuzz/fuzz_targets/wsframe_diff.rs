//! Differential: the same bytes from a client, read by `wsframe` and by tungstenite (both as
//! a server, same size cap), give the same messages and the same verdict. The verdict is the
//! close code a violation is owed (1002, 1007, 1009), or none when the input simply ends.
//! Three differences of form are allowed, each where it is checked below: a refusal that
//! wsframe makes earlier (from a header, at a first bad fragment) while tungstenite waits for
//! bytes that never come; a disallowed close code, which tungstenite hands out as its own
//! Close(1002); and a frame both over the cap and against a header rule, which each refuses
//! with the code of the rule it checks first. The corpus in `corpus/wsframe_diff` keeps the inputs that found both.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pi_ide_broker::wire::wsframe::{Frame, FrameReader, Role};
use std::future::Future;
use std::io::{Cursor, Read, Write};
use std::task::{Context, Poll, Waker};
use tungstenite::protocol::{Role as TRole, WebSocket, WebSocketConfig};
use tungstenite::error::ProtocolError;
use tungstenite::{Error, Message};

const MAX: usize = 1 << 16;

/// What a reader made of the input.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Text(String),
    Binary(Vec<u8>),
    Ping(Vec<u8>),
    Pong(Vec<u8>),
    Close(Option<u16>),
}

/// Polls a future that never waits (its reader is a byte slice) to its end.
fn now<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("a slice never waits"),
    }
}

fn ours(data: &[u8]) -> (Vec<Seen>, Option<u16>) {
    let mut r = FrameReader::new(data, Role::Server, MAX, &[]);
    let mut seen = Vec::new();
    loop {
        match now(r.next()) {
            Ok(None) => return (seen, None),
            Ok(Some(f)) => {
                let s = match f {
                    Frame::Text(t) => Seen::Text(t.to_string()),
                    Frame::Binary(b) => Seen::Binary(b.to_vec()),
                    Frame::Ping(p) => Seen::Ping(p.to_vec()),
                    Frame::Pong(p) => Seen::Pong(p.to_vec()),
                    Frame::Close(c) => Seen::Close(c),
                };
                let closed = matches!(s, Seen::Close(_));
                seen.push(s);
                if closed {
                    return (seen, None);
                }
            }
            Err(e) => return (seen, e.close_code()),
        }
    }
}

/// The input to read and a sink for what tungstenite writes back (pongs, its close).
struct Io<'a>(Cursor<&'a [u8]>);

impl Read for Io<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for Io<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn theirs(data: &[u8]) -> (Vec<Seen>, Option<u16>) {
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX))
        .max_frame_size(Some(MAX));
    let mut ws = WebSocket::from_raw_socket(Io(Cursor::new(data)), TRole::Server, Some(config));
    let mut seen = Vec::new();
    loop {
        match ws.read() {
            Ok(Message::Text(t)) => seen.push(Seen::Text(t.to_string())),
            Ok(Message::Binary(b)) => seen.push(Seen::Binary(b.to_vec())),
            Ok(Message::Ping(p)) => seen.push(Seen::Ping(p.to_vec())),
            Ok(Message::Pong(p)) => seen.push(Seen::Pong(p.to_vec())),
            // A close code not allowed on the wire: tungstenite hands out a Close of its own
            // with 1002 (and sends that back); wsframe refuses the frame with 1002. The same
            // verdict, in two forms.
            Ok(Message::Close(Some(c)))
                if u16::from(c.code) == 1002 && c.reason.as_str() == "Protocol violation" =>
            {
                return (seen, Some(1002))
            }
            Ok(Message::Close(c)) => {
                seen.push(Seen::Close(c.map(|c| u16::from(c.code))));
                return (seen, None);
            }
            Ok(Message::Frame(_)) => {}
            // The input ran out without a close: not a violation of the framing.
            Err(Error::Protocol(ProtocolError::ResetWithoutClosingHandshake)) => return (seen, None),
            Err(Error::Protocol(_)) => return (seen, Some(1002)),
            Err(Error::Utf8(_)) => return (seen, Some(1007)),
            Err(Error::Capacity(_)) => return (seen, Some(1009)),
            // The input ran out (cleanly or in the middle of a frame).
            Err(_) => return (seen, None),
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let (a, b) = (ours(data), theirs(data));
    // wsframe refuses a frame from its header, and a text message at its first bad fragment;
    // tungstenite only once the frame (or message) is whole. When the input ends first, the
    // same messages with a verdict from wsframe and none from tungstenite is that difference.
    if a.0 == b.0 && a.1.is_some() && b.1.is_none() {
        return;
    }
    // A frame over the cap that also breaks a header rule (an oversized control frame, a
    // reserved bit or opcode): wsframe reads the header's rules first (1002, as §5.5 has it
    // for control frames), tungstenite the size (1009). Both refuse it.
    if a.0 == b.0 && a.1 == Some(1002) && b.1 == Some(1009) {
        return;
    }
    assert_eq!(a, b, "wsframe (left) and tungstenite (right) disagree");
});
