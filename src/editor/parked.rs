//! A call parked for a link to come (the editor is taken, or being taken back for calls).

use crate::wire::wsframe::Out;
use tokio::time::Instant;

/// A call waiting for the link dialled for it (or written on it, until the link ends).
pub(super) struct Parked {
    /// The call's broker id.
    pub(super) uid: u64,
    /// Its frame.
    pub(super) frame: Out,
    /// When it is answered as undelivered if still parked.
    pub(super) by: Instant,
    /// Times written so far.
    pub(super) sends: u8,
    /// It may be written again when the editor's close cut it (decided when it was parked).
    pub(super) resend: bool,
}

impl Parked {
    /// The frame to write now; the parked call is kept (in `sent`) with its count.
    pub(super) fn written(mut self) -> (Out, Parked) {
        self.sends += 1;
        let copy = match &self.frame {
            Out::Text(t) => Out::Text(t.clone()),
            Out::Ping(p) => Out::Ping(p.clone()),
            Out::Pong(p) => Out::Pong(p.clone()),
            Out::Close(c) => Out::Close(*c),
        };
        (copy, self)
    }
}
