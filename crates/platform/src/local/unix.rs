//! The local socket on Unix and macOS: a Unix socket in a private dir (0700, ours), made
//! 0600 before `listen`, a leftover probed before it is replaced; the claim an `flock`.

use crate::Error;
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

    /// A listening socket this process inherited (from a service manager or the daemon it
    /// succeeds), made close-on-exec and non-blocking.
    pub fn from_inherited(fd: std::os::fd::OwnedFd) -> std::io::Result<Listener> {
        rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::CLOEXEC)?;
        let fl = rustix::fs::fcntl_getfl(&fd)?;
        rustix::fs::fcntl_setfl(&fd, fl | OFlags::NONBLOCK)?;
        let std_listener = std::os::unix::net::UnixListener::from(fd);
        tokio::net::UnixListener::from_std(std_listener).map(Listener)
    }
}

impl std::os::fd::AsFd for Listener {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// Dials the daemon's socket at `path`, once it is proven the user's: its dir is theirs and
/// closed to others ([`trusted_path`]), and the process listening is of their uid
/// ([`trusted_listener`]). Otherwise nothing is sent and the error (`PermissionDenied`,
/// carrying [`Untrusted`]) says what to do.
pub async fn connect(path: &Path) -> std::io::Result<Stream> {
    trusted_path(path)?;
    let stream = tokio::net::UnixStream::connect(path).await?;
    trusted_listener(&stream, path)?;
    Ok(stream)
}

/// Dials the daemon's socket at `path`, blocking (for a quick "is it up?" outside a runtime),
/// with [`connect`]'s checks.
pub fn connect_blocking(path: &Path) -> std::io::Result<()> {
    trusted_path(path)?;
    let stream = std::os::unix::net::UnixStream::connect(path)?;
    // Elsewhere the dir check stands alone here; the async `connect` that carries traffic
    // checks the listener on every platform.
    #[cfg(target_os = "linux")]
    listener_uid_ok(
        rustix::net::sockopt::socket_peercred(&stream)?.uid.as_raw(),
        path,
    )?;
    drop(stream);
    Ok(())
}

/// Why a client will not speak to what is at a socket path: the path or its listener is not
/// the user's (a squatter in a shared temp dir, another user's socket).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Untrusted(pub String);

/// The environment variable naming other uids whose broker a client may dial (a rootful
/// container's root reaching its host user's socket): comma-separated.
pub const TRUST_UID_ENV: &str = "PI_IDE_BROKER_TRUST_UID";

/// The uids whose socket dirs and listeners a client trusts: its own, root's, and those of
/// [`TRUST_UID_ENV`].
fn trusted_uids() -> Vec<u32> {
    let mut uids = vec![rustix::process::geteuid().as_raw(), 0];
    if let Ok(list) = std::env::var(TRUST_UID_ENV) {
        uids.extend(list.split(',').filter_map(|u| u.trim().parse::<u32>().ok()));
    }
    uids
}

fn untrusted(why: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::PermissionDenied, Untrusted(why))
}

/// The socket's dir is a place only the user (or root) can put a socket: the dir (and a
/// symlink to it) is theirs and not writable by group or others, and each dir above it is
/// theirs or root's, writable by others only with the sticky bit (as `/tmp`). What OpenSSH
/// asks of an agent socket's dir, and what Codex asks of its IDE socket's. One exception: a
/// socket of the user's own in a sticky shared dir (`ssh -R /tmp/pi-ide-broker.sock:…`), which
/// nobody else can replace there.
pub fn trusted_path(path: &Path) -> std::io::Result<()> {
    let uids = trusted_uids();
    let me = uids[0];
    let dir = path.parent().unwrap_or(Path::new("/"));
    let fix = |d: &Path| {
        format!(
            "someone else may be listening there; remove it (rm -rf {}) or set XDG_RUNTIME_DIR (or PI_IDE_BROKER_SOCKET) to a private dir of yours, and start the daemon again",
            d.display()
        )
    };
    let link = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        // Nothing there: the dial fails as "not running", and the daemon started next makes
        // the dir itself (0700, refusing one it does not own).
        Err(_) => return Ok(()),
    };
    if link.file_type().is_symlink() && !uids.contains(&link.uid()) {
        return Err(untrusted(format!(
            "the broker socket dir {} is a symlink of uid {}, not yours (uid {me}): {}",
            dir.display(),
            link.uid(),
            fix(dir)
        )));
    }
    let real = std::fs::canonicalize(dir)?;
    let meta = std::fs::metadata(&real)?;
    if !meta.is_dir() {
        return Err(untrusted(format!(
            "the broker socket dir {} is not a directory: {}",
            dir.display(),
            fix(dir)
        )));
    }
    if !uids.contains(&meta.uid()) {
        return Err(untrusted(format!(
            "the broker socket dir {} belongs to uid {}, not you (uid {me}): {}{}",
            real.display(),
            meta.uid(),
            fix(&real),
            if me == 0 {
                format!(
                    " (to reach that user's broker as root, set {TRUST_UID_ENV}={})",
                    meta.uid()
                )
            } else {
                String::new()
            }
        )));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        // A shared dir with the sticky bit (`/tmp`, where `ssh -R` puts a forward): only the
        // socket's owner may remove or replace it there, so a socket of the user's is theirs.
        let socket_owner = std::fs::symlink_metadata(path).ok().map(|m| m.uid());
        let theirs = socket_owner.filter(|o| !uids.contains(o));
        if mode & 0o1000 == 0 || theirs.is_some() {
            return Err(untrusted(match theirs {
                Some(o) => format!(
                    "the broker socket {} belongs to uid {o}, not you (uid {me}): someone else may be listening there; remove it or set PI_IDE_BROKER_SOCKET to a path in a private dir of yours",
                    path.display()
                ),
                None => format!(
                    "the broker socket dir {} is writable by others (mode {:04o}): {}",
                    real.display(),
                    mode,
                    fix(&real)
                ),
            }));
        }
    }
    trusted_ancestors(&real, &uids)
}

/// Each dir above `real` is a trusted uid's and, if others may write it, sticky: nobody else
/// can swap what is below it.
fn trusted_ancestors(real: &Path, uids: &[u32]) -> std::io::Result<()> {
    for above in real.ancestors().skip(1) {
        let m = std::fs::metadata(above)?;
        let mode = m.mode() & 0o7777;
        let open = mode & 0o022 != 0 && mode & 0o1000 == 0;
        if !uids.contains(&m.uid()) || open {
            return Err(untrusted(format!(
                "the broker socket dir {} lies in {}, which {}: another user could replace it; set XDG_RUNTIME_DIR (or PI_IDE_BROKER_SOCKET) to a private dir of yours",
                real.display(),
                above.display(),
                if open {
                    format!("others can write (mode {mode:04o}, no sticky bit)")
                } else {
                    format!("belongs to uid {}", m.uid())
                }
            )));
        }
    }
    Ok(())
}

/// The process listening at the other end is of a trusted uid (`SO_PEERCRED`, which the
/// kernel sets at `connect` and nobody can forge).
pub fn trusted_listener(stream: &Stream, path: &Path) -> std::io::Result<()> {
    listener_uid_ok(stream.peer_cred()?.uid(), path)
}

fn listener_uid_ok(uid: u32, path: &Path) -> std::io::Result<()> {
    let uids = trusted_uids();
    if uids.contains(&uid) {
        return Ok(());
    }
    Err(untrusted(format!(
        "the process listening on {} runs as uid {uid}, not as you (uid {}): it is not your broker; nothing was sent. Remove the socket's dir ({}) or set XDG_RUNTIME_DIR (or PI_IDE_BROKER_SOCKET) to a private dir of yours",
        path.display(),
        uids[0],
        path.parent().unwrap_or(Path::new("/")).display()
    )))
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

/// [`claim`], waiting (at most `wait`) for the daemon that holds it to let go: a successor
/// taking over from the daemon it replaces.
pub async fn claim_when_free(path: &Path, wait: std::time::Duration) -> Result<Claim, Error> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    secure_dir(dir)?;
    lock_when_free(&dir.join("daemon.lock"), path, wait).await
}

/// [`claim_user`], waiting (at most `wait`) for the daemon that holds it to let go.
pub async fn claim_user_when_free(
    state_dir: &Path,
    socket: &Path,
    wait: std::time::Duration,
) -> Result<Claim, Error> {
    lock_when_free(&state_dir.join("daemon.lock"), socket, wait).await
}

fn open_lock(lock_path: &Path) -> Result<std::os::fd::OwnedFd, Error> {
    rustix::fs::open(
        lock_path,
        OFlags::RDWR | OFlags::CREATE | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::from_raw_mode(0o600),
    )
    .map_err(|e| io("cannot open", lock_path)(e.into()))
}

/// Who holds the lock at `lock_path` on the socket at `path`, as the error it is.
fn held(lock_path: &Path, path: &Path) -> Error {
    let pid = std::fs::read_to_string(lock_path)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0);
    Error::AlreadyRunning {
        pid,
        path: path.to_path_buf(),
    }
}

fn claim_file(lock_path: &Path, path: &Path) -> Result<Claim, Error> {
    let fd = open_lock(lock_path)?;
    if rustix::fs::flock(&fd, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
        return Err(held(lock_path, path));
    }
    Ok(claimed(fd))
}

/// The lock taken once its holder lets go (a blocking `flock` on a thread of its own), or
/// "already running" after `wait`.
async fn lock_when_free(
    lock_path: &Path,
    path: &Path,
    wait: std::time::Duration,
) -> Result<Claim, Error> {
    let fd = open_lock(lock_path)?;
    let waiting = tokio::task::spawn_blocking(move || {
        rustix::fs::flock(&fd, rustix::fs::FlockOperation::LockExclusive).map(|()| fd)
    });
    match tokio::time::timeout(wait, waiting).await {
        Ok(Ok(Ok(fd))) => Ok(claimed(fd)),
        Ok(Ok(Err(e))) => Err(io("cannot lock", lock_path)(e.into())),
        _ => Err(held(lock_path, path)),
    }
}

/// A locked file made a [`Claim`], our pid written in it.
fn claimed(fd: std::os::fd::OwnedFd) -> Claim {
    let mut f = std::fs::File::from(fd);
    {
        use std::io::{Seek, Write};
        let _ = f.set_len(0);
        let _ = f.seek(std::io::SeekFrom::Start(0));
        let _ = write!(f, "{}", std::process::id());
    }
    Claim { _fd: f.into() }
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
    Listener::from_inherited(take_fd3()).ok()
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

    fn untrusted_why(r: std::io::Result<()>) -> String {
        let e = r.expect_err("refused");
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
        assert!(
            e.get_ref().is_some_and(|i| i.is::<Untrusted>()),
            "carries Untrusted: {e:?}"
        );
        e.to_string()
    }

    /// A client dials only a socket in a dir of its own that others cannot write (a squatted
    /// dir in a shared temp dir is refused, with what to do), reached through no one else's
    /// symlink. Needs root (to make another uid's dir).
    #[test]
    fn a_socket_dir_that_is_not_the_users_is_refused_before_any_dial() {
        if !rustix::process::getuid().is_root() {
            println!("SKIPPED: needs root to make another uid's dir; bash .ci/run runs as root");
            return;
        }
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().expect("tempdir");
        let theirs = tmp.path().join("theirs");
        std::fs::create_dir(&theirs).expect("mkdir");
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).expect("chown");
        let why = untrusted_why(trusted_path(&theirs.join("sock")));
        assert!(
            why.contains("belongs to uid 65534") && why.contains("XDG_RUNTIME_DIR"),
            "{why}"
        );
        let open = tmp.path().join("open");
        std::fs::create_dir(&open).expect("mkdir");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let why = untrusted_why(trusted_path(&open.join("sock")));
        assert!(why.contains("writable by others (mode 0777)"), "{why}");
        // A sticky shared dir (an `ssh -R` forward in /tmp): a socket of ours is fine there,
        // another uid's is not.
        let sticky = tmp.path().join("sticky");
        std::fs::create_dir(&sticky).expect("mkdir");
        std::fs::set_permissions(&sticky, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
        let ours = sticky.join("ours.sock");
        let _ours = std::os::unix::net::UnixListener::bind(&ours).expect("bind");
        trusted_path(&ours).expect("our socket in a sticky dir");
        let theirs = sticky.join("theirs.sock");
        let _theirs = std::os::unix::net::UnixListener::bind(&theirs).expect("bind");
        std::os::unix::fs::lchown(&theirs, Some(65534), None).expect("lchown");
        let why = untrusted_why(trusted_path(&theirs));
        assert!(why.contains("belongs to uid 65534"), "{why}");
        // A symlink another user made, wherever it points.
        let mine = tmp.path().join("mine");
        std::fs::create_dir(&mine).expect("mkdir");
        std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&mine, &link).expect("symlink");
        std::os::unix::fs::lchown(&link, Some(65534), None).expect("lchown");
        let why = untrusted_why(trusted_path(&link.join("sock")));
        assert!(why.contains("symlink of uid 65534"), "{why}");
        // Below a dir others may write without the sticky bit: it could be swapped.
        let shared = open.join("inner");
        std::fs::create_dir(&shared).expect("mkdir");
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        let why = untrusted_why(trusted_path(&shared.join("sock")));
        assert!(why.contains("no sticky bit"), "{why}");
        // The user's own private dir (in the sticky /tmp) is fine, and so is one not made yet.
        trusted_path(&mine.join("sock")).expect("a private dir of ours");
        trusted_path(&tmp.path().join("none").join("sock")).expect("no dir yet");
    }

    /// Whatever the dir, the process listening must be the user's: a listener of another
    /// uid is refused after `connect` and before a byte is sent. Needs root (setuid).
    #[tokio::test(flavor = "current_thread")]
    async fn a_listener_of_another_uid_is_refused_and_hears_nothing() {
        if !rustix::process::getuid().is_root() {
            println!("SKIPPED: needs root to listen as another uid; bash .ci/run runs as root");
            return;
        }
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("sock");
        // Bound by root, listening as nobody: the credentials a client sees are the listen's.
        let mut squatter = tokio::process::Command::new("python3")
            .args([
                "-c",
                "import os,socket,sys\ns=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); os.chmod(sys.argv[1], 0o777)\nos.setgid(65534); os.setuid(65534); s.listen(8); print('ready', flush=True)\nwhile True:\n  c,_=s.accept(); d=c.recv(4096); print('got', len(d), flush=True)",
            ])
            .arg(&path)
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("python3");
        let mut out = tokio::io::BufReader::new(squatter.stdout.take().expect("stdout"));
        let mut line = String::new();
        tokio::time::timeout(std::time::Duration::from_secs(10), async {
            use tokio::io::AsyncBufReadExt;
            out.read_line(&mut line).await
        })
        .await
        .expect("in time")
        .expect("read");
        assert_eq!(line.trim(), "ready");
        let e = connect(&path).await.expect_err("refused");
        assert!(e.get_ref().is_some_and(|i| i.is::<Untrusted>()), "{e:?}");
        assert!(e.to_string().contains("runs as uid 65534"), "{e}");
        let why = untrusted_why(connect_blocking(&path));
        assert!(why.contains("runs as uid 65534"), "{why}");
        // It was accepted and heard nothing: zero bytes, twice.
        for _ in 0..2 {
            line.clear();
            tokio::time::timeout(std::time::Duration::from_secs(10), async {
                use tokio::io::AsyncBufReadExt;
                out.read_line(&mut line).await
            })
            .await
            .expect("in time")
            .expect("read");
            assert_eq!(line.trim(), "got 0", "the squatter heard something");
        }
    }
}
