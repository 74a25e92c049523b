//! The broker's local socket: where clients on this machine reach the daemon.
//!
//! A Unix socket on Unix and macOS ([`unix`]): a private dir (0700, ours), the socket made
//! 0600 before `listen`, a leftover probed before it is replaced, the daemon's claim an
//! `flock`. A named pipe on Windows ([`windows`]): a per-user name, a DACL that lets in only
//! the user, remote clients refused, the claim the pipe's first instance. Either way the
//! layers above see a [`Listener`] that yields a [`Stream`] and a [`connect`] that dials one.

#[cfg(unix)]
mod unix;
#[cfg(unix)]
pub use unix::*;

#[cfg(windows)]
mod windows;
#[cfg(windows)]
pub use windows::*;

use super::Error;
use std::path::{Path, PathBuf};

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> Error + 'a {
    move |source| Error::IoAt {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// What a daemon's running record (`running.json`) says: its pid, and its socket if named.
pub fn recorded(record: &Path) -> Option<(u32, Option<PathBuf>)> {
    let text = std::fs::read_to_string(record).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let pid = u32::try_from(v.get("pid")?.as_u64()?).ok()?;
    Some((pid, v.get("socket")?.as_str().map(PathBuf::from)))
}

/// The socket a live daemon recorded in `record`, if its pid still runs and the socket exists.
pub fn running_socket(record: &Path) -> Option<PathBuf> {
    let (pid, socket) = recorded(record)?;
    let socket = socket?;
    (crate::process::alive(pid) && exists(&socket)).then_some(socket)
}
