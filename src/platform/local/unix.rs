//! The local socket on Unix and macOS: a Unix socket in a private dir (0700, ours), made
//! 0600 before `listen`, a leftover probed before it is replaced; the claim an `flock`.

use crate::platform::Error;
use rustix::fs::{Mode, OFlags};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::Path;

use super::io;

/// A connection on the local socket, either end.
pub type Stream = tokio::net::UnixStream;

/// The daemon's listening socket.
pub struct Listener(tokio::net::UnixListener);

impl Listener {
    /// The next connection.
    pub async fn accept(&self) -> std::io::Result<Stream> {
        self.0.accept().await.map(|(s, _)| s)
    }
}

/// Dials the daemon's socket at `path`.
pub async fn connect(path: &Path) -> std::io::Result<Stream> {
    tokio::net::UnixStream::connect(path).await
}

/// Dials the daemon's socket at `path`, blocking (for a quick "is it up?" outside a runtime).
pub fn connect_blocking(path: &Path) -> std::io::Result<()> {
    std::os::unix::net::UnixStream::connect(path).map(drop)
}

/// A non-blocking peek at one byte of a socket: 1 if any is waiting, 0 at the end of the
/// stream, `WouldBlock` if nothing is.
pub fn peek_socket(socket: &impl std::os::fd::AsFd) -> std::io::Result<usize> {
    let mut byte = [0u8; 1];
    let flags = rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT;
    Ok(rustix::net::recv(socket.as_fd(), &mut byte, flags)?.0)
}

/// Resolves once a read on `stream` may not block.
pub async fn readable(stream: &Stream) -> std::io::Result<()> {
    stream.readable().await
}

/// After [`readable`]: 1 if bytes wait on `stream`, 0 at its end; `WouldBlock` clears the
/// readiness.
pub fn try_peek(stream: &Stream) -> std::io::Result<usize> {
    stream.try_io(tokio::io::Interest::READABLE, || peek_socket(stream))
}

/// A peek at `stream` now, whatever its readiness says (see [`peek_socket`]).
pub fn peek_now(stream: &Stream) -> std::io::Result<usize> {
    peek_socket(stream)
}

/// The platform's own default socket, where it has one apart from the config's rules: none
/// on Unix (`sys::config` picks a runtime dir).
pub fn default_path() -> Option<std::path::PathBuf> {
    None
}

/// True if something (a socket, live or stale) is at `path`.
pub fn exists(path: &Path) -> bool {
    path.exists()
}

/// Creates (0700) or checks the socket's parent dir: it must be ours and not writable by others.
pub fn secure_dir(dir: &Path) -> Result<(), Error> {
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(io("cannot create socket dir", dir))?;
            // `recursive` applies the mode to the last component only through umask; force it.
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(io("cannot chmod socket dir", dir))?;
            Ok(())
        }
        Err(e) => Err(io("cannot stat socket dir", dir)(e)),
        Ok(meta) => {
            let me = rustix::process::getuid().as_raw();
            if !meta.is_dir() {
                return Err(Error::Unsafe(format!(
                    "socket dir {} is not a directory; remove it or set another socket path",
                    dir.display()
                )));
            }
            if meta.uid() != me {
                return Err(Error::Unsafe(format!(
                    "socket dir {} belongs to uid {}, not to you (uid {me}); remove it or set another socket path",
                    dir.display(),
                    meta.uid()
                )));
            }
            let mode = meta.mode() & 0o777;
            if mode & 0o022 != 0 {
                return Err(Error::Unsafe(format!(
                    "socket dir {} is writable by others (mode {mode:04o}); run chmod 700 {}",
                    dir.display(),
                    dir.display()
                )));
            }
            if mode != 0o700 {
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                    .map_err(io("cannot chmod socket dir", dir))?;
            }
            Ok(())
        }
    }
}

/// The daemon's exclusive claim on a socket path: an `flock` on `<dir>/daemon.lock`, held for
/// the daemon's life. Two daemons started at once cannot both pass it, whatever the timing.
pub struct Claim {
    /// The locked file (the lock goes with the fd).
    _fd: std::os::fd::OwnedFd,
}

/// Takes the claim on the socket at `path`, or says who holds it.
pub fn claim(path: &Path) -> Result<Claim, Error> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    secure_dir(dir)?;
    claim_file(&dir.join("daemon.lock"), path)
}

/// Takes the per-user claim in the state dir: one daemon per user, whatever socket path its
/// environment gave it (a client with a cleared environment computes another one). `record`
/// is the running daemon's `running.json`, read to name the holder.
pub fn claim_user(state_dir: &Path, socket: &Path, record: &Path) -> Result<Claim, Error> {
    // (`record` names the holder: see `super::running_socket`.)
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(state_dir)
        .map_err(|e| io("cannot create", state_dir)(e))?;
    claim_file(&state_dir.join("daemon.lock"), socket).map_err(|e| match e {
        Error::AlreadyRunning { pid, path } => {
            let recorded = super::running_socket(record);
            Error::AlreadyRunning {
                pid,
                path: recorded.unwrap_or(path),
            }
        }
        e => e,
    })
}

fn claim_file(lock_path: &Path, path: &Path) -> Result<Claim, Error> {
    let lock_path = lock_path.to_path_buf();
    let fd = rustix::fs::open(
        &lock_path,
        OFlags::RDWR | OFlags::CREATE | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::from_raw_mode(0o600),
    )
    .map_err(|e| io("cannot open", &lock_path)(e.into()))?;
    if rustix::fs::flock(&fd, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
        let pid = std::fs::read_to_string(&lock_path)
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0);
        return Err(Error::AlreadyRunning {
            pid,
            path: path.to_path_buf(),
        });
    }
    let mut f = std::fs::File::from(fd);
    {
        use std::io::{Seek, Write};
        let _ = f.set_len(0);
        let _ = f.seek(std::io::SeekFrom::Start(0));
        let _ = write!(f, "{}", std::process::id());
    }
    Ok(Claim { _fd: f.into() })
}

/// Binds the socket: a leftover probed (a live daemon means "already running"), mode 0600
/// set between `bind` and `listen`. Call with the [`Claim`] held.
pub async fn bind(path: &Path) -> Result<Listener, Error> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_socket() {
            return Err(Error::Unsafe(format!(
                "{} exists and is not a socket; remove it or set another socket path",
                path.display()
            )));
        }
        match tokio::net::UnixStream::connect(path).await {
            Ok(s) => {
                let pid = s
                    .peer_cred()
                    .ok()
                    .and_then(|c| c.pid())
                    .and_then(|p| u32::try_from(p).ok())
                    .unwrap_or(0);
                return Err(Error::AlreadyRunning {
                    pid,
                    path: path.to_path_buf(),
                });
            }
            Err(_) => {
                tracing::info!(socket = %path.display(), "replacing a stale socket left by a previous run");
                std::fs::remove_file(path).map_err(io("cannot remove stale socket", path))?;
            }
        }
    }
    let fd = bound_private(path)?;
    rustix::net::listen(&fd, 1024).map_err(|e| io("cannot listen on", path)(e.into()))?;
    let std_listener = std::os::unix::net::UnixListener::from(fd);
    tokio::net::UnixListener::from_std(std_listener)
        .map(Listener)
        .map_err(io("cannot register socket", path))
}

/// A socket bound at `path` and made 0600, not yet listening: nobody can connect to it before
/// its mode is the owner's alone, whatever the umask.
fn bound_private(path: &Path) -> Result<std::os::fd::OwnedFd, Error> {
    let fd = unix_stream_socket().map_err(|e| io("cannot create socket", path)(e.into()))?;
    let addr = rustix::net::SocketAddrUnix::new(path)
        .map_err(|e| io("socket path too long", path)(e.into()))?;
    rustix::net::bind(&fd, &addr).map_err(|e| io("cannot bind", path)(e.into()))?;
    rustix::fs::chmod(path, Mode::from_raw_mode(0o600))
        .map_err(|e| io("cannot chmod socket", path)(e.into()))?;
    Ok(fd)
}

/// A new Unix stream socket, close-on-exec and non-blocking. Where the kernel takes both
/// flags at creation (Linux, the BSDs) they are set atomically; Apple's `socket(2)` takes no
/// flags, so there they are set with `fcntl` right after (the daemon forks nothing before the
/// socket is bound, so the window where it lacks close-on-exec holds no `exec`).
fn unix_stream_socket() -> rustix::io::Result<std::os::fd::OwnedFd> {
    #[cfg(not(target_vendor = "apple"))]
    {
        rustix::net::socket_with(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::STREAM,
            rustix::net::SocketFlags::CLOEXEC | rustix::net::SocketFlags::NONBLOCK,
            None,
        )
    }
    #[cfg(target_vendor = "apple")]
    {
        let fd = rustix::net::socket(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::STREAM,
            None,
        )?;
        rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::CLOEXEC)?;
        let fl = rustix::fs::fcntl_getfl(&fd)?;
        rustix::fs::fcntl_setfl(&fd, fl | OFlags::NONBLOCK)?;
        Ok(fd)
    }
}

/// Takes a listener passed by systemd socket activation (`LISTEN_FDS`/`LISTEN_PID`), if any.
/// Only the first call can take it.
pub fn inherited() -> Option<Listener> {
    static TAKEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let pid: u32 = std::env::var("LISTEN_PID").ok()?.parse().ok()?;
    let fds: u32 = std::env::var("LISTEN_FDS").ok()?.parse().ok()?;
    if pid != std::process::id() || fds < 1 || TAKEN.swap(true, std::sync::atomic::Ordering::SeqCst)
    {
        return None;
    }
    let fd = take_fd3();
    let _ = rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::CLOEXEC);
    let fl = rustix::fs::fcntl_getfl(&fd).ok()?;
    rustix::fs::fcntl_setfl(&fd, fl | OFlags::NONBLOCK).ok()?;
    let std_listener = std::os::unix::net::UnixListener::from(fd);
    tokio::net::UnixListener::from_std(std_listener)
        .ok()
        .map(Listener)
}

#[allow(unsafe_code)]
fn take_fd3() -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd;
    // SAFETY: with LISTEN_PID == our pid and LISTEN_FDS >= 1, the service manager passed us
    // a listening socket at fd 3 (SD_LISTEN_FDS_START); nothing else in this process owns it,
    // and the TAKEN flag in `inherited` makes sure it is taken once.
    unsafe { std::os::fd::OwnedFd::from_raw_fd(3) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The socket is 0600 while it cannot yet be connected to (bound, not listening): there
    /// is no moment when another user's connect could be accepted under a wider mode.
    #[test]
    fn the_socket_is_private_before_it_listens() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sock");
        let fd = bound_private(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "mode {mode:o} before listen");
        let refused = std::os::unix::net::UnixStream::connect(&path);
        assert!(refused.is_err(), "connectable before listen");
        rustix::net::listen(&fd, 1).unwrap();
        assert!(std::os::unix::net::UnixStream::connect(&path).is_ok());
    }
}
