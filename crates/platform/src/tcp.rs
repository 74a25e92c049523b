//! TCP socket options the broker tunes, on editor links and on loopback doors.
//!
//! Prompt ACKs on an editor link while answers are owed, and the kernel holding back silent
//! connections to a loopback door.
//!
//! Editors built on libuv (the Lua ones: pi-ide.nvim, claudecode.nvim) leave Nagle's algorithm
//! on. A direct client has one call in flight per connection, so that costs it nothing; the
//! broker multiplexes many sessions onto one connection, and there the editor holds each small
//! answer until the one before it is acknowledged, while Linux delays an ACK that has no data
//! to ride on by up to 40 ms. Acknowledging at once while answers are still owed releases the
//! next answer a loopback round trip later instead.
//!
//! Measured and not taken (README, Performance): capping the link's delayed ACK with
//! `TCP_DELACK_MAX_US` (Linux 6.15+, two timer ticks at least) saves the `setsockopt` and the
//! ACK, but a held answer then waits for the broker's next request or the cap (8 ms at
//! HZ=250); and deferring the ACK to when the runtime parks saves nothing, since an answer and
//! the next request almost never share a turn.
//!
//! macOS has no `TCP_QUICKACK`, so there this is a no-op. What a libuv editor then costs
//! (inferred, not measured: no Mac here): XNU's delayed ACK (`net.inet.tcp.delayed_ack`, on by
//! default) holds an ACK for at most about 100 ms, and it acknowledges every second segment at
//! once, so with several calls in flight on one link an answer held by the editor's Nagle can
//! wait up to that long; one call at a time (a single session, the usual case) is not delayed,
//! as the editor's Nagle never holds the first unacknowledged segment.

use tokio::net::TcpStream;

/// A duplicate of the link's socket where the platform can send ACKs at once (Linux).
#[cfg(any(target_os = "linux", target_os = "android"))]
type Dup = std::os::fd::OwnedFd;
/// Nothing to hold where the platform cannot.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
type Dup = ();

/// A handle on an editor link's socket for sending ACKs at once.
pub struct QuickAck {
    /// A duplicate of the link's socket (the stream itself is split into the link's halves).
    fd: Option<Dup>,
}

impl QuickAck {
    /// A handle on `stream`'s socket (a no-op if it cannot be duplicated).
    pub fn new(stream: &TcpStream) -> Self {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        let fd = {
            use std::os::fd::AsFd;
            stream.as_fd().try_clone_to_owned().ok()
        };
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        let fd = {
            let _ = stream;
            None
        };
        QuickAck { fd }
    }

    /// Sends any delayed ACK now. One `setsockopt`; callers do it only while answers are owed.
    pub fn now(&self) {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        if let Some(fd) = &self.fd {
            let _ = rustix::net::sockopt::set_tcp_quickack(fd, true);
        }
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        let _ = &self.fd;
    }
}

/// `TCP_DEFER_ACCEPT` for `wait` on a listening socket (Linux; rustix has no setter for it):
/// the kernel holds a connection that has sent nothing. A no-op elsewhere.
#[allow(unsafe_code)]
pub fn defer_accept(
    socket: &tokio::net::TcpSocket,
    wait: std::time::Duration,
) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let secs: libc::c_int = wait.as_secs().clamp(1, 60).try_into().unwrap_or(1);
        // SAFETY: a valid socket fd, and a c_int option passed with its size.
        let r = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_DEFER_ACCEPT,
                std::ptr::from_ref(&secs).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (socket, wait);
        Ok(())
    }
}
