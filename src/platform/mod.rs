//! The platform seam: everything the broker asks of the OS, behind one interface per need.
//!
//! - [`local`]: the broker's local socket (a Unix socket; a named pipe on Windows): listen,
//!   connect, the one-daemon claim, the private dir it lives in.
//! - [`peer`]: who is at the other end of a local connection (uid or SID, pid, program,
//!   namespaces).
//! - [`process`]: is a pid running, and when did it start.
//! - [`ports`]: which other clients an editor's loopback port has (the taken-editor check).
//! - [`control`]: stop and reload: the requests a daemon listens for and the way another
//!   process sends them (signals on Unix, named events on Windows).
//! - [`notify`]: telling the service manager (systemd) how the daemon is doing.
//! - [`user`]: who we are, and whether a file is ours and private.
//!
//! Each module keeps its OS-specific code in `cfg`'d items of its own; the layers above never
//! name `rustix`, `libc`, `std::os::unix` or `windows-sys`. Bottom layer: uses nothing else of
//! the crate.

pub mod allocator;
pub mod control;
pub mod local;
pub mod logfile;
pub mod notify;
pub mod peer;
pub mod ports;
pub mod process;
pub mod tcp;
pub mod user;
