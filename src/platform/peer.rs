//! Who is at the other end of a local socket: its uid, its pid, its program, its namespaces.
//!
//! OS facts only; what they grant is `frontdoor::rights`'s to decide. On Linux the pid comes
//! from `SO_PEERCRED` (translated into our pid namespace, 0 when the peer's is not visible
//! from ours), the program from `/proc/<pid>/comm` (readable for any process) and the
//! namespaces from `/proc/<pid>/ns/{mnt,pid}` (readable only where we may ptrace-read the
//! peer: not for a non-dumpable process of ours such as `ssh`, always for root). Elsewhere
//! there are no namespaces to read.

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
    /// They exist but could not be read, and why (no pid, a non-dumpable process, …).
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
    Ok(PeerFacts {
        uid: cred.uid(),
        pid,
        program: pid.and_then(program),
        place: pid.map_or_else(
            || {
                if cfg!(target_os = "linux") {
                    Place::Unreadable(
                        "the kernel gave no pid (its pid namespace is not visible from ours)"
                            .into(),
                    )
                } else {
                    Place::NoneHere
                }
            },
            place,
        ),
    })
}

/// The facts of the client at the other end of the pipe `stream`: its pid from the pipe, its
/// SID from that process's token. A SID other than ours reads as uid `u32::MAX`, which no
/// config lists (the pipe's DACL lets in only our SID anyway).
#[cfg(windows)]
pub fn of_stream(stream: &crate::platform::local::Stream) -> std::io::Result<PeerFacts> {
    let pid = stream.client_pid()?;
    let theirs = crate::platform::user::sid::of_process(pid)?;
    let me = crate::platform::user::sid::own();
    Ok(PeerFacts {
        uid: if theirs == *me { me.rid() } else { u32::MAX },
        pid: Some(pid),
        program: None,
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
}
