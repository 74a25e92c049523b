//! Prompt ACKs on an editor link.
//!
//! Editors built on libuv (the Lua ones: pi-ide.nvim, claudecode.nvim) leave Nagle's algorithm
//! on. A direct client has one call in flight per connection, so that costs it nothing; the
//! broker multiplexes many sessions onto one connection, and there the editor holds each small
//! answer until the one before it is acknowledged, while Linux delays an ACK that has no data
//! to ride on by up to 40 ms.
//!
//! Acknowledging at once after every read cost more than anything else at 32 sessions: an ACK
//! segment of its own per read, where the next request would have carried it a few dozen
//! microseconds later. So the ACK is deferred instead ([`AckDue`]): a read while answers are
//! owed arms a 1 ms timer, and when it fires the ACK is sent only if no request went to the
//! editor since the last read (a request carries the ACK). An answer held by Nagle waits at
//! most about two milliseconds (the delay and the timer's granularity), never 40.

use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// How long an owed ACK waits for a request to carry it.
pub const ACK_DELAY: Duration = Duration::from_millis(1);

/// A handle on an editor link's socket for sending ACKs at once.
pub struct QuickAck {
    /// A duplicate of the link's socket (the stream itself is split into the link's halves).
    fd: Option<OwnedFd>,
}

impl QuickAck {
    /// A handle on `stream`'s socket (a no-op if it cannot be duplicated).
    pub fn new(stream: &TcpStream) -> Self {
        QuickAck {
            fd: stream.as_fd().try_clone_to_owned().ok(),
        }
    }

    /// Sends any delayed ACK now. One `setsockopt`.
    pub fn now(&self) {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        if let Some(fd) = &self.fd {
            let _ = rustix::net::sockopt::set_tcp_quickack(fd, true);
        }
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        let _ = &self.fd;
    }
}

/// When an editor link owes the editor an ACK, as a value (the link task owns the timer).
///
/// `sent` is a count of requests written to the editor that only grows (the link's minted
/// ids): a request sent after a read carries that read's ACK.
#[derive(Debug, Default)]
pub struct AckDue {
    /// Armed: when to decide. Not moved by later reads, so no read waits longer than
    /// [`ACK_DELAY`] after the first unacknowledged one.
    at: Option<Instant>,
    /// `sent` as it was when the last read was handled.
    sent_at_read: u64,
}

impl AckDue {
    /// A read was handled while answers are still owed. Returns the time to arm the timer
    /// for when it was not armed yet (`None`: it already is).
    pub fn read(&mut self, now: Instant, sent: u64) -> Option<Instant> {
        self.sent_at_read = sent;
        if self.at.is_some() {
            return None;
        }
        let at = now + ACK_DELAY;
        self.at = Some(at);
        Some(at)
    }

    /// The armed time, if any.
    pub fn at(&self) -> Option<Instant> {
        self.at
    }

    /// The timer fired: disarms, and says whether to send the ACK now (true unless a request
    /// went out after the last read and carried it).
    pub fn fire(&mut self, sent: u64) -> bool {
        self.at.take().is_some() && sent == self.sent_at_read
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ack_no_request_carried_is_sent_when_the_timer_fires() {
        let t0 = Instant::now();
        let mut due = AckDue::default();
        assert_eq!(due.read(t0, 5), Some(t0 + ACK_DELAY));
        assert!(due.fire(5), "nothing went out since the read: ACK now");
        assert_eq!(due.at(), None, "disarmed");
        assert!(!due.fire(5), "a disarmed timer sends nothing");
    }

    #[test]
    fn a_request_after_the_last_read_carries_the_ack() {
        let t0 = Instant::now();
        let mut due = AckDue::default();
        due.read(t0, 5);
        assert!(!due.fire(6), "request 6 went out after the read");
        assert_eq!(due.at(), None);
    }

    #[test]
    fn a_read_after_the_carrying_request_still_gets_its_ack_in_time() {
        let t0 = Instant::now();
        let mut due = AckDue::default();
        due.read(t0, 5);
        // Request 6 acknowledged the first read; then the editor sent more.
        assert_eq!(
            due.read(t0 + Duration::from_micros(500), 6),
            None,
            "the timer keeps its time: later reads never postpone it"
        );
        assert_eq!(due.at(), Some(t0 + ACK_DELAY));
        assert!(due.fire(6), "the second read is not acknowledged yet");
        // After firing, the next read arms the timer again.
        let t1 = t0 + Duration::from_millis(3);
        assert_eq!(due.read(t1, 6), Some(t1 + ACK_DELAY));
    }
}
