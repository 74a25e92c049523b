//! An editor's lockfile as validated (`Lockfile`), and the check of its port made at each dial.
//!
//! Read and validated by `registry::lifecycle::lockfile`; everything in a lockfile is hostile
//! until proven otherwise: see docs/security.md.

use super::Error;
use crate::protocol::family::Family;
use crate::sys::secret::Token;
use std::path::PathBuf;

/// The largest lockfile read; real ones are a few hundred bytes.
pub const MAX_LOCKFILE_BYTES: u64 = 64 * 1024;

/// A validated lockfile: an editor that claims to listen on `port`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lockfile {
    /// The file it came from.
    pub path: PathBuf,
    /// The family of the dir it was found in (decides the auth header).
    pub family: Family,
    /// The port, from the file name.
    pub port: u16,
    /// The editor's process id, alive when read.
    pub pid: u32,
    /// Workspace folders as written (not normalised).
    pub workspace_folders: Vec<String>,
    /// `ideName`, or `"unknown"`.
    pub ide_name: String,
    /// The token for the auth header; `None` for an editor that writes none (Emacs's
    /// claude-code-ide.el): the link is dialled without the header.
    pub auth_token: Option<Token>,
    /// The editor runs on Windows and we do not (a broker in WSL reading the Windows side's
    /// lockfile, `runningInWindows`): its pid is a Windows pid we cannot look up, its folders
    /// were written as Windows paths (mapped here), and every path on its link is mapped
    /// both ways with this.
    pub wsl: Option<crate::protocol::winpath::Wsl>,
}

impl Error {
    /// True for states that resolve themselves (half-written files) and deserve no warning.
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Incomplete | Error::Gone)
    }

    /// True when the lockfile is shown not to be the user's editor's: another user owns it,
    /// may write it, runs its pid or listens on its port.
    pub fn is_foreign(&self) -> bool {
        matches!(
            self,
            Error::ForeignOwner(_)
                | Error::OthersMayWrite { .. }
                | Error::ForeignPid { .. }
                | Error::ForeignListener { .. }
        )
    }
}

/// Whose the editor's port is, before its token goes there: refused when a socket of another
/// user listens on it at an address a dial of 127.0.0.1 reaches
/// ([`crate::platform::ports::listener_uids`]) or, given `client_port` (the local port of a
/// connection just made to it), when the server end of that very connection is another
/// user's ([`crate::platform::ports::accepted_uids`]: no race with a listener that came or
/// went meanwhile). Nothing listening is no refusal: the dial fails on its own, and no token
/// is sent. Where the kernel's table cannot be read (not Linux, or `/proc` hidden) nothing
/// can be told, and the port is taken as before this check. A Windows editor seen from WSL
/// listens on the Windows side, which is not in this table: not checked.
pub fn check_port(lock: &Lockfile, client_port: Option<u16>) -> Result<(), Error> {
    if lock.wsl.is_some() {
        return Ok(());
    }
    let mut uids = crate::platform::ports::listener_uids(lock.port).unwrap_or_default();
    if let Some(client_port) = client_port {
        uids.extend(
            crate::platform::ports::accepted_uids(lock.port, client_port).unwrap_or_default(),
        );
    }
    let me = crate::platform::user::uid();
    match uids.into_iter().find(|uid| *uid != me) {
        Some(uid) => Err(Error::ForeignListener {
            port: lock.port,
            uid,
        }),
        None => Ok(()),
    }
}
