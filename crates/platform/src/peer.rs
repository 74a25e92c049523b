//! Who is at the other end of a local socket: its uid, its pid, its program, its namespaces.
//!
//! OS facts only; what they grant is `frontdoor::rights`'s to decide. On Linux the peer is
//! pinned by a handle that cannot be recycled: `SO_PEERPIDFD` (Linux 6.5+), a pidfd of the
//! very process that called `connect`. Its facts are read from `/proc/<pid>` (the program from
//! `comm` and `exe`, the namespaces from `ns/{mnt,pid}`; `exe` and `ns` are readable only where
//! we may ptrace-read the peer: not for a non-dumpable process of ours such as `ssh`, always
//! for root), and only then is the pidfd asked whether that process still exists: while it
//! does (a zombie too), its pid cannot name another process, so what `/proc` said was its own.
//! A peer that exited before it was accepted (its pid free for reuse: the pid race of issue
//! 61) or while it was read has no facts: [`Place::Unreadable`], which the rights read as
//! "not known to be local". Kernels without `SO_PEERPIDFD` get a pidfd opened at accept: it
//! guards the reads, but not a pid reused before the accept (docs/security.md says so).
//! Elsewhere there are no namespaces to read.

/// The namespaces a process lives in, as the kernel names them (`mnt:[4026531841]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespaces {
    /// Its mount namespace (a container has its own).
    pub mnt: String,
    /// Its pid namespace.
    pub pid: String,
}

/// Where a peer's namespaces stand, as far as the OS tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// Read: these.
    Read(Namespaces),
    /// This platform has none (not Linux).
    NoneHere,
    /// They exist but could not be read, and why (no pid, a non-dumpable process, a peer
    /// that exited before its facts were proven its own, …).
    Unreadable(String),
}

/// What the OS says of a connected peer, read once when it connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerFacts {
    /// Its uid.
    pub uid: u32,
    /// Its pid as we see it; `None` when the kernel gave none (0: not visible from our pid
    /// namespace, or a platform that does not say).
    pub pid: Option<u32>,
    /// Its program's name (`comm`), where readable.
    pub program: Option<String>,
    /// Its executable's path (`/proc/<pid>/exe`), where readable.
    pub exe: Option<String>,
    /// Its executable is one of this machine's OpenSSH programs (`ssh`, `sshd`,
    /// `sshd-session`), told by the file itself (device and inode), whatever it is called:
    /// `slogin` is `ssh`.
    pub runs_ssh: bool,
    /// Its namespaces.
    pub place: Place,
}

/// The facts of the peer of `stream`, or why its credentials could not be read.
#[cfg(unix)]
pub fn of_stream(stream: &tokio::net::UnixStream) -> std::io::Result<PeerFacts> {
    let cred = stream.peer_cred()?;
    let pid = cred
        .pid()
        .and_then(|p| u32::try_from(p).ok())
        .filter(|p| *p != 0);
    let Some(pid) = pid else {
        return Ok(PeerFacts {
            uid: cred.uid(),
            pid: None,
            program: None,
            exe: None,
            runs_ssh: false,
            place: if cfg!(target_os = "linux") {
                Place::Unreadable(
                    "the kernel gave no pid (its pid namespace is not visible from ours)".into(),
                )
            } else {
                Place::NoneHere
            },
        });
    };
    #[cfg(target_os = "linux")]
    {
        Ok(linux::pinned(stream, cred.uid(), pid))
    }
    #[cfg(not(target_os = "linux"))]
    {
        Ok(read_facts(cred.uid(), pid))
    }
}

/// The facts `/proc` (or the platform) gives of `pid`, unproven: the caller makes sure they
/// were of the process it means.
#[cfg(unix)]
fn read_facts(uid: u32, pid: u32) -> PeerFacts {
    let exe = exe(pid);
    PeerFacts {
        uid,
        pid: Some(pid),
        program: program(pid),
        runs_ssh: exe.as_ref().is_some_and(|e| is_ssh_binary(&e.1)),
        exe: exe.map(|e| e.0),
        place: place(pid),
    }
}

/// The facts of a peer whose process cannot be proven to be the one that connected: the
/// uid (from the socket, which cannot race) and nothing that could grant more.
#[cfg(target_os = "linux")]
fn unproven(uid: u32, pid: u32, why: String) -> PeerFacts {
    PeerFacts {
        uid,
        pid: Some(pid),
        program: None,
        exe: None,
        runs_ssh: false,
        place: Place::Unreadable(why),
    }
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
mod linux {
    use super::{read_facts, unproven, PeerFacts};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    /// `SO_PEERPIDFD` (`asm-generic/socket.h`; SPARC numbers it apart).
    #[cfg(not(any(target_arch = "sparc", target_arch = "sparc64")))]
    const SO_PEERPIDFD: libc::c_int = 77;
    #[cfg(any(target_arch = "sparc", target_arch = "sparc64"))]
    const SO_PEERPIDFD: libc::c_int = 0x56;

    /// How the peer's process was pinned.
    enum Pin {
        /// `SO_PEERPIDFD`: the process that called `connect`.
        Peer(OwnedFd),
        /// An older kernel: a pidfd of whatever holds the pid at accept.
        AtAccept(OwnedFd),
    }

    /// The peer's facts, proven its own by a pidfd (see the module's doc), or unproven.
    pub(super) fn pinned(stream: &impl AsRawFd, uid: u32, pid: u32) -> PeerFacts {
        let pin = match peer_pidfd(stream) {
            Ok(fd) => Pin::Peer(fd),
            Err(e) if e.raw_os_error() == Some(libc::ENOPROTOOPT) => {
                match rustix::process::Pid::from_raw(pid as i32).map(|p| {
                    rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty())
                }) {
                    Some(Ok(fd)) => Pin::AtAccept(fd),
                    Some(Err(e)) => {
                        return unproven(uid, pid, format!("its process {pid} is gone ({e})"))
                    }
                    None => return unproven(uid, pid, format!("pid {pid} is not a pid")),
                }
            }
            Err(e) => {
                return unproven(
                    uid,
                    pid,
                    format!("the process that connected (pid {pid}) exited before it was accepted, so its pid may name another process now ({e})"),
                )
            }
        };
        let facts = read_facts(uid, pid);
        let fd = match &pin {
            Pin::Peer(fd) | Pin::AtAccept(fd) => fd,
        };
        if let Err(e) = still_there(fd) {
            return unproven(
                uid,
                pid,
                format!(
                    "the process that connected (pid {pid}) exited while its facts were read ({e})"
                ),
            );
        }
        facts
    }

    /// `getsockopt(SO_PEERPIDFD)`: a pidfd of the peer's process, which fails once it has
    /// exited (`EINVAL`/`ESRCH`) and on kernels before 6.5 (`ENOPROTOOPT`).
    fn peer_pidfd(stream: &impl AsRawFd) -> std::io::Result<OwnedFd> {
        let mut fd: libc::c_int = -1;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `fd` and `len` are valid for the kernel to write an int and its length.
        let r = unsafe {
            libc::getsockopt(
                stream.as_raw_fd(),
                libc::SOL_SOCKET,
                SO_PEERPIDFD,
                (&mut fd as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if fd < 0 {
            return Err(std::io::Error::from_raw_os_error(libc::EBADF));
        }
        // SAFETY: the kernel just made `fd` for us; nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Signal 0 through the pidfd: `Ok` while its process exists (a zombie too, whose pid is
    /// not free yet), `ESRCH` once it was reaped.
    fn still_there(fd: &OwnedFd) -> std::io::Result<()> {
        // SAFETY: a plain syscall on a pidfd we own; no pointers but the null siginfo.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd.as_raw_fd(),
                0,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if r == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ENOSYS) {
            return Err(e);
        }
        // An emulator without the syscall (valgrind): the pidfd's own account of its process,
        // whose `Pid:` is -1 (or 0, outside our namespace) once it has exited.
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))?;
        let pid = info
            .lines()
            .find_map(|l| l.strip_prefix("Pid:"))
            .and_then(|p| p.trim().parse::<i64>().ok());
        match pid {
            Some(p) if p > 0 => Ok(()),
            _ => Err(std::io::Error::from_raw_os_error(libc::ESRCH)),
        }
    }
}

/// The facts of the client at the other end of the pipe `stream`: its pid from the pipe, its
/// SID from that process's token. A SID other than ours reads as uid `u32::MAX`, which no
/// config lists (the pipe's DACL lets in only our SID anyway).
#[cfg(windows)]
pub fn of_stream(stream: &crate::local::Stream) -> std::io::Result<PeerFacts> {
    let pid = stream.client_pid()?;
    let theirs = crate::user::sid::of_process(pid)?;
    let me = crate::user::sid::own();
    Ok(PeerFacts {
        uid: if theirs == *me { me.rid() } else { u32::MAX },
        pid: Some(pid),
        program: None,
        exe: None,
        runs_ssh: false,
        place: Place::NoneHere,
    })
}

/// This process's own namespaces (read once).
pub fn own_place() -> &'static Place {
    static OWN: std::sync::OnceLock<Place> = std::sync::OnceLock::new();
    OWN.get_or_init(|| place(std::process::id()))
}

/// The namespaces of `pid`.
pub fn place(pid: u32) -> Place {
    if !cfg!(target_os = "linux") {
        return Place::NoneHere;
    }
    let read = |kind: &str| {
        std::fs::read_link(format!("/proc/{pid}/ns/{kind}"))
            .map(|p| p.display().to_string())
            .map_err(|e| format!("cannot read /proc/{pid}/ns/{kind}: {e}"))
    };
    match (read("mnt"), read("pid")) {
        (Ok(mnt), Ok(pid)) => Place::Read(Namespaces { mnt, pid }),
        (Err(e), _) | (_, Err(e)) => Place::Unreadable(e),
    }
}

/// The program name of `pid` (Linux's `comm`, at most 15 bytes), where readable.
#[cfg(unix)]
pub fn program(pid: u32) -> Option<String> {
    if !cfg!(target_os = "linux") {
        return None;
    }
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    Some(comm.trim_end_matches('\n').to_string()).filter(|c| !c.is_empty())
}

/// The executable of `pid`: its path and its file's (device, inode), where readable.
#[cfg(unix)]
fn exe(pid: u32) -> Option<(String, (u64, u64))> {
    use std::os::unix::fs::MetadataExt;
    if !cfg!(target_os = "linux") {
        return None;
    }
    let link = format!("/proc/{pid}/exe");
    let path = std::fs::read_link(&link).ok()?;
    // `stat` of the magic link is the running file itself, however it was reached.
    let meta = std::fs::metadata(&link).ok()?;
    Some((path.display().to_string(), (meta.dev(), meta.ino())))
}

/// Whether the file `(device, inode)` is one of this machine's OpenSSH programs: the client
/// (`ssh`, wherever `PATH` finds it, and its usual homes) and the server's (`sshd`,
/// `sshd-session`). Read once: an OpenSSH upgrade while the broker runs makes a new file,
/// which the name check in `frontdoor::rights` still catches.
#[cfg(unix)]
fn is_ssh_binary(file: &(u64, u64)) -> bool {
    static KNOWN: std::sync::OnceLock<Vec<(u64, u64)>> = std::sync::OnceLock::new();
    KNOWN
        .get_or_init(|| {
            use std::os::unix::fs::MetadataExt;
            let mut paths: Vec<std::path::PathBuf> = std::env::var_os("PATH")
                .map(|p| std::env::split_paths(&p).map(|d| d.join("ssh")).collect())
                .unwrap_or_default();
            for dir in [
                "/usr/bin",
                "/bin",
                "/usr/local/bin",
                "/usr/sbin",
                "/usr/local/sbin",
            ] {
                paths.push(std::path::Path::new(dir).join("ssh"));
                paths.push(std::path::Path::new(dir).join("sshd"));
            }
            for dir in ["/usr/lib/openssh", "/usr/libexec/openssh", "/usr/libexec"] {
                for name in ["sshd-session", "sshd-auth", "sshd"] {
                    paths.push(std::path::Path::new(dir).join(name));
                }
            }
            let mut known: Vec<(u64, u64)> = paths
                .iter()
                .filter_map(|p| std::fs::metadata(p).ok())
                .filter(|m| m.is_file())
                .map(|m| (m.dev(), m.ino()))
                .collect();
            known.sort_unstable();
            known.dedup();
            known
        })
        .contains(file)
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_child_shares_our_namespaces_and_has_its_own_program_name() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let pid = child.id();
        let theirs = place(pid);
        let _ = child.kill();
        let _ = child.wait();
        let Place::Read(ours) = own_place().clone() else {
            panic!("our own namespaces are readable: {:?}", own_place());
        };
        assert!(ours.mnt.starts_with("mnt:["), "{ours:?}");
        assert!(ours.pid.starts_with("pid:["), "{ours:?}");
        assert_eq!(theirs, Place::Read(ours));
        assert!(program(std::process::id()).is_some());
        assert!(matches!(place(u32::MAX), Place::Unreadable(_)));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_socket_peer_in_this_process_is_us() {
        let (a, _b) = tokio::net::UnixStream::pair().expect("pair");
        let f = of_stream(&a).expect("peer facts");
        assert_eq!(f.uid, rustix::process::getuid().as_raw());
        assert_eq!(f.pid, Some(std::process::id()));
        assert_eq!(&f.place, own_place());
        assert_eq!(f.program, program(std::process::id()));
    }

    /// The pid race (issue 61): the process that connected exits, and its pid is given to a
    /// process of ours in our namespaces before the connection is accepted. Read by pid, the
    /// peer would be that process (the owner); pinned by `SO_PEERPIDFD`, it has no facts.
    /// Needs root (the pid is steered through `/proc/sys/kernel/ns_last_pid`).
    #[tokio::test(flavor = "current_thread")]
    async fn a_peer_whose_pid_was_reused_before_the_accept_has_no_facts() {
        if !rustix::process::getuid().is_root() {
            println!(
                "SKIPPED: the pid-reuse race needs root (ns_last_pid); bash .ci/run runs as root"
            );
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
        for _ in 0..50 {
            // A process that connects, says something and exits (reaped here).
            let mut child = std::process::Command::new("python3")
                .args([
                    "-c",
                    "import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(b'GET /v1/pi-sessions')",
                ])
                .arg(&path)
                .spawn()
                .expect("python3");
            let gone = child.id();
            assert!(child.wait().expect("wait").success());
            // Its pid, given to a `sleep` of ours.
            if std::fs::write("/proc/sys/kernel/ns_last_pid", (gone - 1).to_string()).is_err() {
                println!("SKIPPED: /proc/sys/kernel/ns_last_pid is not writable here");
                return;
            }
            let mut sleeper = std::process::Command::new("sleep")
                .arg("30")
                .spawn()
                .expect("sleep");
            let reused = sleeper.id() == gone;
            let (accepted, _) = listener.accept().expect("accept");
            accepted.set_nonblocking(true).expect("nonblocking");
            let stream = tokio::net::UnixStream::from_std(accepted).expect("tokio stream");
            let facts = of_stream(&stream).expect("credentials");
            let _ = sleeper.kill();
            let _ = sleeper.wait();
            if !reused {
                continue; // another process took the pid first: try again
            }
            assert_eq!(facts.pid, Some(gone));
            assert!(
                matches!(&facts.place, Place::Unreadable(why) if why.contains("exited")),
                "the reused pid's process is not the peer: {facts:?}"
            );
            assert_eq!(facts.program, None, "{facts:?}");
            return;
        }
        panic!("the pid was never reused in 50 tries");
    }

    /// A peer that is still there when it is accepted is read as itself.
    #[cfg(target_os = "linux")]
    #[tokio::test(flavor = "current_thread")]
    async fn a_live_peer_in_another_process_is_read_and_proven() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sock");
        let listener = tokio::net::UnixListener::bind(&path).expect("bind");
        let mut child = tokio::process::Command::new("python3")
            .args([
                "-c",
                "import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); sys.stdin.read()",
            ])
            .arg(&path)
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("python3");
        let (stream, _) =
            tokio::time::timeout(std::time::Duration::from_secs(10), listener.accept())
                .await
                .expect("accepted in time")
                .expect("accept");
        let facts = of_stream(&stream).expect("credentials");
        assert_eq!(facts.pid, child.id());
        assert_eq!(&facts.place, own_place());
        assert!(
            facts.exe.as_deref().is_some_and(|e| e.contains("python")),
            "{facts:?}"
        );
        assert!(!facts.runs_ssh);
        drop(child.stdin.take());
        let _ = child.wait().await;
    }
}
