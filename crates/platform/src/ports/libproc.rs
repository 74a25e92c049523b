//! libproc's view of a process's sockets (XNU `bsd/sys/proc_info.h`). The structures are
//! written out here (the `libc` crate has only some of them), with their sizes checked by the
//! tests on every platform: the same fixed-width fields give the same layout on both Apple
//! targets (LP64) and on Linux.

/// `PROC_PIDLISTFDS`: the flavour of `proc_pidinfo` listing a process's descriptors.
pub const PROC_PIDLISTFDS: i32 = 1;
/// `PROC_PIDFDSOCKETINFO`: the flavour of `proc_pidfdinfo` describing a socket.
pub const PROC_PIDFDSOCKETINFO: i32 = 3;
/// `PROX_FDTYPE_SOCKET`.
pub const PROX_FDTYPE_SOCKET: u32 = 2;
/// `SOCKINFO_TCP`: `soi_kind` of a TCP socket.
pub const SOCKINFO_TCP: i32 = 2;
/// `TSI_S_ESTABLISHED`.
pub const TSI_S_ESTABLISHED: i32 = 4;

/// `struct proc_fdinfo`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ProcFdInfo {
    pub proc_fd: i32,
    pub proc_fdtype: u32,
}

/// `struct proc_fileinfo`.
#[repr(C)]
pub struct ProcFileInfo {
    pub fi_openflags: u32,
    pub fi_status: u32,
    pub fi_offset: i64,
    pub fi_type: i32,
    pub fi_guardflags: u32,
}

/// `struct vinfo_stat` (only its size matters here).
#[repr(C)]
pub struct VinfoStat {
    pub vst_dev: u32,
    pub vst_mode: u16,
    pub vst_nlink: u16,
    pub vst_ino: u64,
    pub vst_uid: u32,
    pub vst_gid: u32,
    pub vst_times: [i64; 8],
    pub vst_size: i64,
    pub vst_blocks: i64,
    pub vst_blksize: i32,
    pub vst_flags: u32,
    pub vst_gen: u32,
    pub vst_rdev: u32,
    pub vst_qspare: [i64; 2],
}

/// `struct sockbuf_info`.
#[repr(C)]
pub struct SockbufInfo {
    pub sbi: [u32; 5],
    pub sbi_flags: i16,
    pub sbi_timeo: i16,
}

/// `struct in_sockinfo`; ports are in network byte order.
#[repr(C)]
pub struct InSockInfo {
    pub insi_fport: i32,
    pub insi_lport: i32,
    pub insi_gencnt: u64,
    pub insi_flags: u32,
    pub insi_flow: u32,
    pub insi_vflag: u8,
    pub insi_ip_ttl: u8,
    pub rfu_1: u32,
    pub insi_faddr: [u32; 4],
    pub insi_laddr: [u32; 4],
    pub insi_v4: u8,
    pub insi_v6: [i32; 3],
}

/// `struct tcp_sockinfo`.
#[repr(C)]
pub struct TcpSockInfo {
    pub tcpsi_ini: InSockInfo,
    pub tcpsi_state: i32,
    pub tcpsi_timer: [i32; 4],
    pub tcpsi_mss: i32,
    pub tcpsi_flags: u32,
    pub rfu_1: u32,
    pub tcpsi_tp: u64,
}

/// `soi_proto`: the TCP member, and the largest (`struct un_sockinfo`: two handles and two
/// `SOCK_MAXADDRLEN` (255) addresses), which sets the size the kernel fills.
#[repr(C)]
pub union SoiProto {
    pub pri_tcp: std::mem::ManuallyDrop<TcpSockInfo>,
    pub pri_un: [u8; 16 + 255 + 255],
    pub align: u64,
}

/// `struct socket_info`.
#[repr(C)]
pub struct SocketInfo {
    pub soi_stat: VinfoStat,
    pub soi_so: u64,
    pub soi_pcb: u64,
    pub soi_type: i32,
    pub soi_protocol: i32,
    pub soi_family: i32,
    pub soi_shorts: [i16; 7],
    pub soi_error: u16,
    pub soi_oobmark: u32,
    pub soi_rcv: SockbufInfo,
    pub soi_snd: SockbufInfo,
    pub soi_kind: i32,
    pub rfu_1: u32,
    pub soi_proto: SoiProto,
}

/// `struct socket_fdinfo`: what `PROC_PIDFDSOCKETINFO` fills.
#[repr(C)]
pub struct SocketFdInfo {
    pub pfi: ProcFileInfo,
    pub psi: SocketInfo,
}

/// The client port of a TCP connection the server on `port` has accepted, if `info` is one
/// (established, local port `port`).
pub fn accepted_from(info: &SocketFdInfo, port: u16) -> Option<u16> {
    if info.psi.soi_kind != SOCKINFO_TCP {
        return None;
    }
    // SAFETY: soi_kind says the union holds the TCP member; it is plain data.
    let tcp = unsafe { &info.psi.soi_proto.pri_tcp };
    let net = |p: i32| u16::from_be(u16::try_from(p & 0xffff).unwrap_or(0));
    let lport = net(tcp.tcpsi_ini.insi_lport);
    (tcp.tcpsi_state == TSI_S_ESTABLISHED && lport == port).then(|| net(tcp.tcpsi_ini.insi_fport))
}

/// [`super::clients_of`] through libproc, on the editor's own process.
#[cfg(target_os = "macos")]
pub fn clients_of(pid: u32, port: u16, except_client_port: Option<u16>) -> Option<usize> {
    use std::mem::size_of;
    let pid = libc::c_int::try_from(pid).ok()?;
    // SAFETY: a null buffer asks for the size needed.
    let need = unsafe { libc::proc_pidinfo(pid, PROC_PIDLISTFDS, 0, std::ptr::null_mut(), 0) };
    let need = usize::try_from(need).ok().filter(|n| *n > 0)?;
    // Room for descriptors opened meanwhile.
    let mut fds = vec![ProcFdInfo::default(); need / size_of::<ProcFdInfo>() + 32];
    let bytes = libc::c_int::try_from(fds.len() * size_of::<ProcFdInfo>()).ok()?;
    // SAFETY: `fds` holds `bytes` bytes of plain `proc_fdinfo` records.
    let got =
        unsafe { libc::proc_pidinfo(pid, PROC_PIDLISTFDS, 0, fds.as_mut_ptr().cast(), bytes) };
    let got = usize::try_from(got).ok().filter(|n| *n > 0)? / size_of::<ProcFdInfo>();
    let size = libc::c_int::try_from(size_of::<SocketFdInfo>()).ok()?;
    let mut n = 0;
    for fd in fds
        .iter()
        .take(got)
        .filter(|f| f.proc_fdtype == PROX_FDTYPE_SOCKET)
    {
        let mut info = std::mem::MaybeUninit::<SocketFdInfo>::zeroed();
        // SAFETY: the buffer is a zeroed `socket_fdinfo` of `size` bytes.
        let filled = unsafe {
            libc::proc_pidfdinfo(
                pid,
                fd.proc_fd,
                PROC_PIDFDSOCKETINFO,
                info.as_mut_ptr().cast(),
                size,
            )
        };
        if filled != size {
            continue; // closed meanwhile, or not a socket any more
        }
        // SAFETY: the kernel filled all of it; every bit pattern is valid plain data.
        let info = unsafe { info.assume_init() };
        if accepted_from(&info, port).is_some_and(|c| Some(c) != except_client_port) {
            n += 1;
        }
    }
    Some(n)
}
