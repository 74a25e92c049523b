//! A daemon handing its listening socket to its successor (an upgrade), which takes it.
//!
//! The socket never stops listening, so no client finds nobody.
//!
//! The old daemon keeps a duplicate of its listening socket from the start ([`Kept`]). When
//! its binary is replaced it starts the new one ([`start_successor`]) with that socket and one
//! end of a socket pair inherited, their numbers and the old daemon's pid in
//! [`ENV`]. The successor ([`taken`]) checks that its parent is the pid named (a variable
//! leaked to another process is ignored), says it runs by writing one byte on the pair
//! ([`Taken::tell_started`]), and serves on the inherited socket once the old daemon's claims
//! are free. Connections that arrive in between wait in the socket's backlog. Unix only:
//! Windows replaces no running binary, so nothing there hands over.

use std::path::Path;
use std::time::Duration;

/// The variable that tells a successor what it inherits: `<old pid>:<listener fd>:<pair fd>`.
pub const ENV: &str = "PI_IDE_BROKER_HANDOVER";

/// A started successor, not yet known to run.
pub struct Successor {
    child: tokio::process::Child,
    #[cfg(unix)]
    started: tokio::net::UnixStream,
}

impl Successor {
    /// Waits (at most `within`) until the successor says it runs; its pid. If it exits first
    /// or stays silent, it is stopped (killed, if still there) and the error says what it did.
    pub async fn started(mut self, within: Duration) -> Result<u32, String> {
        let pid = self.child.id().unwrap_or(0);
        let said = imp::read_started(&mut self, within).await;
        match said {
            Ok(()) => Ok(pid),
            Err(why) => {
                let _ = self.child.start_kill();
                let status = tokio::time::timeout(Duration::from_secs(2), self.child.wait()).await;
                Err(match status {
                    Ok(Ok(s)) => format!("{why} ({s})"),
                    _ => why,
                })
            }
        }
    }
}

/// What a successor inherited from the daemon it replaces.
pub struct Taken {
    /// The old daemon's pid.
    pub from: u32,
    #[cfg(unix)]
    listener: std::os::fd::OwnedFd,
    #[cfg(unix)]
    started: Option<std::os::fd::OwnedFd>,
}

impl Taken {
    /// Tells the old daemon this one runs (its binary started, its config read): it may step
    /// down. Said once.
    pub fn tell_started(&mut self) {
        imp::tell_started(self);
    }

    /// The inherited listening socket, as the daemon's listener.
    pub fn listener(self) -> std::io::Result<super::local::Listener> {
        imp::listener(self)
    }
}

/// A duplicate of the daemon's listening socket, kept to hand over.
pub struct Kept {
    #[cfg(unix)]
    fd: std::os::fd::OwnedFd,
}

/// Keeps a duplicate of `listener` for a later handover; `None` where there is none to make.
pub fn keep(listener: &super::local::Listener) -> Option<Kept> {
    imp::keep(listener)
}

/// Starts `exe` with `args` (the old daemon's own), its output where ours goes, in a process
/// group of its own, inheriting `kept` (and the pair it says it runs on).
pub fn start_successor(
    exe: &Path,
    args: &[std::ffi::OsString],
    kept: &Kept,
) -> std::io::Result<Successor> {
    imp::start_successor(exe, args, kept)
}

/// The handover this process was started for, if [`ENV`] names its parent and the fds are
/// what it says; taken once (later calls: `None`).
pub fn taken() -> Option<Taken> {
    static TAKEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let spec = std::env::var(ENV).ok()?;
    if TAKEN.swap(true, std::sync::atomic::Ordering::SeqCst) {
        return None;
    }
    let found = parse(&spec).and_then(|(from, listener, pair)| imp::taken(from, listener, pair));
    if found.is_none() {
        tracing::warn!(
            "{ENV}={spec} names no handover to this process (not from its parent, or not a listening socket); starting as usual"
        );
    }
    found
}

/// `(from, listener, pair)` of a [`ENV`] value.
fn parse(spec: &str) -> Option<(u32, i32, i32)> {
    let mut parts = spec.split(':').map(str::parse::<i64>);
    let from = u32::try_from(parts.next()?.ok()?).ok()?;
    let listener = i32::try_from(parts.next()?.ok()?).ok()?;
    let pair = i32::try_from(parts.next()?.ok()?).ok()?;
    (parts.next().is_none() && listener > 2 && pair > 2 && listener != pair)
        .then_some((from, listener, pair))
}

#[cfg(unix)]
#[allow(unsafe_code)]
mod imp {
    use super::{Kept, Successor, Taken};
    use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
    use std::path::Path;
    use std::time::Duration;

    pub(super) fn keep(listener: &crate::local::Listener) -> Option<Kept> {
        let fd = listener.as_fd().try_clone_to_owned().ok()?;
        Some(Kept { fd })
    }

    pub(super) fn start_successor(
        exe: &Path,
        args: &[std::ffi::OsString],
        kept: &Kept,
    ) -> std::io::Result<Successor> {
        // Close-on-exec on every platform (std sets it), so only the successor inherits one.
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
        let listen_raw = kept.fd.as_raw_fd();
        let pair_raw = theirs.as_raw_fd();
        let mut cmd = tokio::process::Command::new(exe);
        cmd.args(args)
            .env(
                super::ENV,
                format!("{}:{listen_raw}:{pair_raw}", std::process::id()),
            )
            .stdin(std::process::Stdio::null())
            .process_group(0);
        // SAFETY: the closure runs in the child between fork and exec and calls only `fcntl`,
        // which is async-signal-safe; both fds are open in the parent (owned by `kept` and by
        // `theirs`, alive until `spawn` returns) and so in the child, where only their
        // close-on-exec flag is cleared so the new program inherits them.
        unsafe {
            cmd.pre_exec(move || {
                for raw in [listen_raw, pair_raw] {
                    let fd = BorrowedFd::borrow_raw(raw);
                    rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty())?;
                }
                Ok(())
            });
        }
        let child = cmd.spawn()?;
        drop(theirs);
        ours.set_nonblocking(true)?;
        let started = tokio::net::UnixStream::from_std(ours)?;
        Ok(Successor { child, started })
    }

    pub(super) async fn read_started(s: &mut Successor, within: Duration) -> Result<(), String> {
        use tokio::io::AsyncReadExt;
        let mut byte = [0u8; 1];
        match tokio::time::timeout(within, s.started.read(&mut byte)).await {
            Ok(Ok(1)) => Ok(()),
            Ok(Ok(_)) => Err("it exited before it could take over".into()),
            Ok(Err(e)) => Err(format!("cannot hear from it: {e}")),
            Err(_) => Err(format!(
                "it did not say it runs within {} s",
                within.as_secs()
            )),
        }
    }

    pub(super) fn taken(from: u32, listen_raw: i32, pair_raw: i32) -> Option<Taken> {
        let parent = rustix::process::getppid().map(|p| p.as_raw_nonzero().get());
        if parent != i32::try_from(from).ok() {
            return None;
        }
        // SAFETY: the fds are checked open (fcntl) before being owned, and `super::taken`
        // lets this run once per process, so nothing else owns them: the parent named them
        // as inherited for us alone.
        let owned = |raw: i32| -> Option<OwnedFd> {
            rustix::io::fcntl_getfd(unsafe { BorrowedFd::borrow_raw(raw) }).ok()?;
            Some(unsafe { OwnedFd::from_raw_fd(raw) })
        };
        let listener = owned(listen_raw)?;
        let started = owned(pair_raw)?;
        for fd in [&listener, &started] {
            let _ = rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::CLOEXEC);
        }
        listening_unix(&listener).then_some(Taken {
            from,
            listener,
            started: Some(started),
        })
    }

    /// A Unix socket, listening (where the OS says; Apple's `getsockopt` has no
    /// `SO_ACCEPTCONN` in rustix, and there the address family alone is checked).
    fn listening_unix(fd: &OwnedFd) -> bool {
        let unix = rustix::net::getsockname(fd)
            .is_ok_and(|a| a.address_family() == rustix::net::AddressFamily::UNIX);
        #[cfg(any(target_os = "linux", target_os = "android"))]
        let unix = unix && rustix::net::sockopt::socket_acceptconn(fd).unwrap_or(false);
        unix
    }

    pub(super) fn tell_started(t: &mut Taken) {
        if let Some(fd) = t.started.take() {
            let _ = rustix::io::write(&fd, b"1");
        }
    }

    pub(super) fn listener(t: Taken) -> std::io::Result<crate::local::Listener> {
        crate::local::Listener::from_inherited(t.listener)
    }
}

#[cfg(windows)]
mod imp {
    use super::{Kept, Successor, Taken};
    use std::path::Path;
    use std::time::Duration;

    pub(super) fn keep(_: &crate::local::Listener) -> Option<Kept> {
        None
    }

    pub(super) fn start_successor(
        _: &Path,
        _: &[std::ffi::OsString],
        _: &Kept,
    ) -> std::io::Result<Successor> {
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "no handover on Windows",
        ))
    }

    pub(super) async fn read_started(_: &mut Successor, _: Duration) -> Result<(), String> {
        Err("no handover on Windows".into())
    }

    pub(super) fn taken(_: u32, _: i32, _: i32) -> Option<Taken> {
        None
    }

    pub(super) fn tell_started(_: &mut Taken) {}

    pub(super) fn listener(_: Taken) -> std::io::Result<crate::local::Listener> {
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "no handover on Windows",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn only_a_whole_spec_of_three_distinct_fds_above_stdio_is_taken() {
        assert_eq!(parse("41:5:6"), Some((41, 5, 6)));
        for bad in [
            "", "41:5", "41:5:6:7", "41:5:5", "41:2:6", "x:5:6", "41:-1:6", "-3:5:6",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}
