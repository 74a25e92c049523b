//! Any bytes from a peer as WebSocket frames, in either role: the reader ends in frames, a
//! clean end or an error, never a panic; what it reads, written again, reads back the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pi_ide_broker::wire::wsframe::{Frame, FrameReader, FrameWriter, Out, Role};
use std::future::Future;
use std::task::{Context, Poll, Waker};

/// Polls a future that never waits (its reader is a byte slice) to its end.
fn now<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("a slice never waits"),
    }
}

fuzz_target!(|data: &[u8]| {
    for role in [Role::Server, Role::Client] {
        let mut r = FrameReader::new(data, role, 1 << 16, &[]);
        let mut again = FrameWriter::new(Vec::new(), Role::Client);
        let mut texts = Vec::new();
        while let Ok(Some(f)) = now(r.next()) {
            if let Frame::Text(t) = f {
                texts.push(t.to_string());
                now(futures_util::SinkExt::send(&mut again, Out::Text(t.to_string()))).expect("a Vec takes it");
            }
        }
        let bytes = again.into_inner();
        let mut back = FrameReader::new(&bytes[..], Role::Server, 1 << 16, &[]);
        for t in texts {
            assert_eq!(now(back.next()).ok().flatten(), Some(Frame::Text(&t)));
        }
    }
});
