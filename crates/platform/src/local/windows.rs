//! The local socket on Windows: a named pipe.
//!
//! The pipe's name comes from the socket "path" (`\\.\pipe\…` as given, anything else mapped
//! to a name under `\\.\pipe\`); the default is per user (`pi-ide-broker-<SID>`, see
//! `sys::config`). Every instance is created with a DACL that grants only our SID, rejects
//! remote (SMB) clients, and the first one with `FILE_FLAG_FIRST_PIPE_INSTANCE`: a pipe of
//! that name that someone else made first is refused, never joined. Clients open it at the
//! identification impersonation level, so a squatter could not act as them. The daemon's
//! claim is the first instance, plus a file in the state dir opened without sharing.

use super::{io, Error};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::windows::named_pipe::{
    ClientOptions, NamedPipeClient, NamedPipeServer, PipeMode, ServerOptions,
};

/// The prefix of every local pipe name.
pub const PIPE_PREFIX: &str = r"\\.\pipe\";

/// The default pipe: one per user, named by the user's SID (no other user can hold the name
/// first without being refused by [`bind`]'s first-instance rule, nor open ours by its DACL).
pub fn default_path() -> Option<PathBuf> {
    let me = crate::user::sid::own();
    (!me.0.is_empty()).then(|| PathBuf::from(format!("{PIPE_PREFIX}pi-ide-broker-{}", me.0)))
}

/// The pipe name the socket "path" stands for.
pub fn pipe_name(path: &Path) -> String {
    let text = path.to_string_lossy();
    let rest = match text.strip_prefix(PIPE_PREFIX) {
        Some(rest) => rest.to_string(),
        None => format!("pi-ide-broker-{text}"),
    };
    // Any character but a backslash may name a pipe.
    let rest: String = rest
        .chars()
        .map(|c| {
            if matches!(c, '\\' | '/' | ':') {
                '-'
            } else {
                c
            }
        })
        .collect();
    format!("{PIPE_PREFIX}{rest}")
}

/// A connection on the pipe, either end.
pub enum Stream {
    /// The daemon's end.
    Server(NamedPipeServer),
    /// A client's end.
    Client(NamedPipeClient),
}

impl Stream {
    /// The pid of the client at the other end (server side), from the pipe.
    pub fn client_pid(&self) -> std::io::Result<u32> {
        use std::os::windows::io::AsRawHandle;
        let Stream::Server(s) = self else {
            return Err(std::io::Error::new(
                ErrorKind::InvalidInput,
                "not a server end",
            ));
        };
        let mut pid = 0u32;
        #[allow(unsafe_code)]
        // SAFETY: the handle is the live pipe instance's; `pid` is writable.
        let ok = unsafe {
            windows_sys::Win32::System::Pipes::GetNamedPipeClientProcessId(
                s.as_raw_handle(),
                &mut pid,
            )
        };
        if ok == 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(pid)
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Server(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Client(c) => Pin::new(c).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Server(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Client(c) => Pin::new(c).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Server(s) => Pin::new(s).poll_flush(cx),
            Stream::Client(c) => Pin::new(c).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Server(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Client(c) => Pin::new(c).poll_shutdown(cx),
        }
    }
}

/// A non-blocking peek at one byte of a socket: 1 if any is waiting, 0 at the end of the
/// stream, `WouldBlock` if nothing is.
pub fn peek_socket(socket: &impl std::os::windows::io::AsRawSocket) -> std::io::Result<usize> {
    use windows_sys::Win32::Networking::WinSock::{recv, WSAGetLastError, MSG_PEEK};
    let mut byte = [0u8; 1];
    #[allow(unsafe_code)]
    // SAFETY: the socket is live for the call; `byte` is writable for 1 byte. tokio's sockets
    // are non-blocking, so this returns WSAEWOULDBLOCK when nothing waits.
    let n = unsafe {
        recv(
            socket.as_raw_socket() as usize,
            byte.as_mut_ptr(),
            1,
            MSG_PEEK,
        )
    };
    if n < 0 {
        #[allow(unsafe_code)]
        // SAFETY: reads this thread's last Winsock error.
        return Err(std::io::Error::from_raw_os_error(unsafe {
            WSAGetLastError()
        }));
    }
    Ok(usize::try_from(n).unwrap_or(0))
}

/// Resolves once a read on `stream` may not block.
pub async fn readable(stream: &Stream) -> std::io::Result<()> {
    match stream {
        Stream::Server(s) => s.readable().await,
        Stream::Client(c) => c.readable().await,
    }
}

/// After [`readable`]: 1, for bytes or the end of the stream, either of which the next read
/// takes. No true peek: mio reads a pipe ahead into a buffer of its own as soon as readiness
/// is asked, so `PeekNamedPipe` sees nothing once a wait has begun.
pub fn try_peek(_: &Stream) -> std::io::Result<usize> {
    Ok(1)
}

/// A peek before any wait (nothing read ahead yet): `PeekNamedPipe`, 1 if bytes wait, 0 if
/// the client is gone, `WouldBlock` if nothing came yet.
pub fn peek_now(stream: &Stream) -> std::io::Result<usize> {
    use std::os::windows::io::AsRawHandle;
    let handle = match stream {
        Stream::Server(s) => s.as_raw_handle(),
        Stream::Client(c) => c.as_raw_handle(),
    };
    let mut avail = 0u32;
    #[allow(unsafe_code)]
    // SAFETY: the handle is the live pipe's; only the byte count is written.
    let ok = unsafe {
        windows_sys::Win32::System::Pipes::PeekNamedPipe(
            handle,
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut(),
            &mut avail,
            std::ptr::null_mut(),
        )
    };
    if ok == 0 {
        let e = std::io::Error::last_os_error();
        // ERROR_BROKEN_PIPE: the other end closed.
        return if e.raw_os_error() == Some(109) {
            Ok(0)
        } else {
            Err(e)
        };
    }
    if avail == 0 {
        return Err(std::io::Error::from(ErrorKind::WouldBlock));
    }
    Ok(1)
}

/// The daemon's pipe: the instance waiting for the next client.
pub struct Listener {
    name: String,
    next: tokio::sync::Mutex<NamedPipeServer>,
}

impl Listener {
    /// The next connection; a new instance waits for the one after.
    pub async fn accept(&self) -> std::io::Result<Stream> {
        let mut next = self.next.lock().await;
        next.connect().await?;
        let fresh = create(&self.name, false)?;
        Ok(Stream::Server(std::mem::replace(&mut *next, fresh)))
    }
}

/// One instance of the pipe `name`, only our SID let in, remote clients refused.
fn create(name: &str, first: bool) -> std::io::Result<NamedPipeServer> {
    let mut opts = ServerOptions::new();
    // `pipe_mode` first, then `reject_remote_clients`: tokio documents that older versions
    // folded both into one field, where the later call could clear the other.
    opts.pipe_mode(PipeMode::Byte)
        .reject_remote_clients(true)
        .first_pipe_instance(first);
    let sa = dacl::OwnerOnly::new()?;
    #[allow(unsafe_code)]
    // SAFETY: `sa` is a valid SECURITY_ATTRIBUTES whose descriptor lives until it is dropped,
    // after the call.
    unsafe {
        opts.create_with_security_attributes_raw(name, sa.as_ptr())
    }
}

/// A private, owner-only security descriptor for the pipe.
mod dacl {
    #![allow(unsafe_code)]
    use windows_sys::Win32::Foundation::LocalFree;
    use windows_sys::Win32::Security::Authorization::{
        ConvertStringSecurityDescriptorToSecurityDescriptorW, SDDL_REVISION_1,
    };
    use windows_sys::Win32::Security::SECURITY_ATTRIBUTES;

    /// SECURITY_ATTRIBUTES granting our SID alone, freed on drop.
    pub(super) struct OwnerOnly {
        attrs: SECURITY_ATTRIBUTES,
    }

    impl OwnerOnly {
        pub(super) fn new() -> std::io::Result<OwnerOnly> {
            let me = crate::user::sid::own();
            if me.0.is_empty() {
                return Err(std::io::Error::other("cannot read our own SID"));
            }
            // Protected DACL: one ACE, generic all for our SID; nothing inherited.
            let sddl: Vec<u16> = format!("D:P(A;;GA;;;{})", me.0)
                .encode_utf16()
                .chain(Some(0))
                .collect();
            let mut sd = std::ptr::null_mut();
            // SAFETY: `sddl` is NUL-terminated; `sd` receives a LocalAlloc'd descriptor.
            let ok = unsafe {
                ConvertStringSecurityDescriptorToSecurityDescriptorW(
                    sddl.as_ptr(),
                    SDDL_REVISION_1,
                    &mut sd,
                    std::ptr::null_mut(),
                )
            };
            if ok == 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(OwnerOnly {
                attrs: SECURITY_ATTRIBUTES {
                    nLength: std::mem::size_of::<SECURITY_ATTRIBUTES>() as u32,
                    lpSecurityDescriptor: sd,
                    bInheritHandle: 0,
                },
            })
        }

        pub(super) fn as_ptr(&self) -> *mut std::ffi::c_void {
            std::ptr::from_ref(&self.attrs).cast_mut().cast()
        }
    }

    impl Drop for OwnerOnly {
        fn drop(&mut self) {
            // SAFETY: the descriptor came from LocalAlloc (the conversion) and is freed once.
            unsafe { LocalFree(self.attrs.lpSecurityDescriptor) };
        }
    }
}

/// `ERROR_PIPE_BUSY`: every instance is taken; try again shortly.
const ERROR_PIPE_BUSY: i32 = 231;

/// Dials the daemon's pipe for the socket "path" `path`.
pub async fn connect(path: &Path) -> std::io::Result<Stream> {
    let name = pipe_name(path);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match client_options().open(&name) {
            Ok(c) => {
                trusted_server(&c, path)?;
                return Ok(Stream::Client(c));
            }
            Err(e)
                if e.raw_os_error() == Some(ERROR_PIPE_BUSY)
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Nothing to check of a pipe's "path" before dialling: a pipe has no dir; its server's SID is
/// checked when it is dialled ([`connect`]).
pub fn trusted_path(_path: &Path) -> std::io::Result<()> {
    Ok(())
}

/// The process serving the pipe is of the user's SID (`GetNamedPipeServerProcessId`, its
/// token): a pipe of that name made by someone else is not the user's broker, and nothing is
/// sent to it.
fn trusted_server(c: &NamedPipeClient, path: &Path) -> std::io::Result<()> {
    use std::os::windows::io::AsRawHandle;
    let mut pid = 0u32;
    #[allow(unsafe_code)]
    // SAFETY: the handle is the live pipe client's; `pid` is writable.
    let ok = unsafe {
        windows_sys::Win32::System::Pipes::GetNamedPipeServerProcessId(c.as_raw_handle(), &mut pid)
    };
    if ok == 0 {
        return Err(std::io::Error::last_os_error());
    }
    let theirs = crate::user::sid::of_process(pid)?;
    if theirs == *crate::user::sid::own() {
        return Ok(());
    }
    Err(std::io::Error::new(
        ErrorKind::PermissionDenied,
        format!(
            "the pipe {} is served by process {pid} of another user: it is not your broker; nothing was sent",
            pipe_name(path)
        ),
    ))
}

/// Opens at the identification level: the server may learn who we are, never act as us.
fn client_options() -> ClientOptions {
    const SECURITY_IDENTIFICATION: u32 = 1 << 16;
    let mut o = ClientOptions::new();
    o.security_qos_flags(SECURITY_IDENTIFICATION);
    o
}

/// Dials the pipe without a runtime, only to see whether a daemon answers.
pub fn connect_blocking(path: &Path) -> std::io::Result<()> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(pipe_name(path))
        .map(drop)
}

/// True if a daemon's pipe of that name exists.
pub fn exists(path: &Path) -> bool {
    match connect_blocking(path) {
        Ok(()) => true,
        Err(e) => e.raw_os_error() == Some(ERROR_PIPE_BUSY),
    }
}

/// Creates the dir (a pipe needs none: a pipe "path" is left alone) and checks that it is a
/// plain dir, not a link elsewhere; a dir in the user's profile is private by its inherited
/// DACL.
pub fn secure_dir(dir: &Path) -> Result<(), Error> {
    if dir.to_string_lossy().starts_with(PIPE_PREFIX) || dir.as_os_str().is_empty() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).map_err(io("cannot create socket dir", dir))?;
    let meta = std::fs::symlink_metadata(dir).map_err(io("cannot stat socket dir", dir))?;
    if !meta.is_dir() {
        return Err(Error::Unsafe(format!(
            "{} is not a directory (a link?); remove it or set another path",
            dir.display()
        )));
    }
    Ok(())
}

/// The daemon's claim: held for its life. On Windows the pipe's first instance is the claim
/// on the name; this holds the per-user file beside it.
pub struct Claim {
    _file: Option<std::fs::File>,
}

/// The claim on a pipe name is its first instance, taken by [`bind`]; nothing more here.
pub fn claim(_path: &Path) -> Result<Claim, Error> {
    Ok(Claim { _file: None })
}

/// [`claim`]: Windows replaces no running binary, so no successor waits for it.
pub async fn claim_when_free(path: &Path, _wait: std::time::Duration) -> Result<Claim, Error> {
    claim(path)
}

/// [`claim_user`]: no successor waits for it on Windows.
pub async fn claim_user_when_free(
    state_dir: &Path,
    socket: &Path,
    _wait: std::time::Duration,
) -> Result<Claim, Error> {
    claim_user(state_dir, socket, &state_dir.join("running.json"))
}

/// The per-user claim: `daemon.lock` in the state dir, opened without sharing, so a second
/// daemon of the user cannot open it while the first runs.
pub fn claim_user(state_dir: &Path, socket: &Path, record: &Path) -> Result<Claim, Error> {
    use std::os::windows::fs::OpenOptionsExt;
    std::fs::create_dir_all(state_dir).map_err(io("cannot create", state_dir))?;
    let lock_path = state_dir.join("daemon.lock");
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .share_mode(0)
        .open(&lock_path)
    {
        Ok(f) => Ok(Claim { _file: Some(f) }),
        // ERROR_SHARING_VIOLATION: another daemon holds it.
        Err(e) if e.raw_os_error() == Some(32) => Err(Error::AlreadyRunning {
            pid: super::recorded(record).map_or(0, |(pid, _)| pid),
            path: super::running_socket(record).unwrap_or_else(|| socket.to_path_buf()),
        }),
        Err(e) => Err(io("cannot open", &lock_path)(e)),
    }
}

/// Creates the pipe's first instance: a pipe of that name already there (another daemon, or
/// anyone squatting it) is refused.
pub async fn bind(path: &Path) -> Result<Listener, Error> {
    let name = pipe_name(path);
    match create(&name, true) {
        Ok(first) => Ok(Listener {
            name,
            next: tokio::sync::Mutex::new(first),
        }),
        Err(e) if e.kind() == ErrorKind::PermissionDenied => Err(Error::AlreadyRunning {
            pid: 0,
            path: PathBuf::from(name),
        }),
        Err(e) => Err(io("cannot create the pipe", path)(e)),
    }
}

/// Socket activation is a systemd feature: nothing is ever passed on Windows.
pub fn inherited() -> Option<Listener> {
    None
}
