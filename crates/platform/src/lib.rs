//! The platform seam: everything the broker asks of the OS, behind one interface per need.
//!
//! - [`local`]: the broker's local socket (a Unix socket; a named pipe on Windows): listen,
//!   connect, the one-daemon claim, the private dir it lives in.
//! - [`peer`]: who is at the other end of a local connection (uid or SID, pid, program,
//!   namespaces).
//! - [`process`]: is a pid running, when did it start, and whose is it.
//! - [`ports`]: which other clients an editor's loopback port has (the taken-editor check),
//!   and whose its listener is (no token goes to another user's).
//! - [`control`]: stop and reload: the requests a daemon listens for and the way another
//!   process sends them (signals on Unix, named events on Windows).
//! - [`handover`]: a daemon's listening socket handed to its successor (an upgrade).
//! - [`notify`]: telling the service manager (systemd) how the daemon is doing.
//! - [`user`]: who we are, and whether a file is ours and private.
//! - [`rlimit`]: the daemon's open-files limit, raised at start.
//!
//! Each module keeps its OS-specific code in `cfg`'d items of its own; the layers above never
//! name `rustix`, `libc`, `std::os::unix` or `windows-sys`. Bottom layer: uses nothing else of
//! the crate.
#![deny(unsafe_code)]
#![warn(missing_docs)]

use std::path::PathBuf;

pub mod allocator;
pub mod control;
pub mod handover;
pub mod local;
pub mod logfile;
pub mod notify;
pub mod peer;
pub mod ports;
pub mod process;
pub mod rlimit;
pub mod sync;
pub mod tcp;
pub mod user;

/// What the OS refused, from any need of this layer; every message says what went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Another daemon holds the socket (`local`).
    #[error("already running (pid {pid}) on {path}; stop it first, or use `pi-ide-broker status`")]
    AlreadyRunning {
        /// Its pid (0 if unknown).
        pid: u32,
        /// The socket.
        path: PathBuf,
    },
    /// The socket's dir is not safe (`local`).
    #[error("{0}")]
    Unsafe(String),
    /// An OS error, with what we were doing and where.
    #[error("{what} {path}: {source}")]
    IoAt {
        /// What we were doing.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file that must be ours is a symlink or a reparse point (`user`).
    #[error("is a symlink")]
    Symlink,
    /// It is gone (`user`).
    #[error("is gone")]
    Gone,
    /// It is a FIFO, a dir, a device (`user`).
    #[error("is not a regular file")]
    NotRegular,
    /// Another user owns it: their uid, `u32::MAX` for another SID (`user`).
    #[error("belongs to uid {0}, not to us")]
    ForeignOwner(u32),
    /// Another OS error.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
