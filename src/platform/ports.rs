//! Who else holds a loopback port, read from the kernel without connecting.
//!
//! The established connections a local server has accepted, looked up without connecting (so a
//! single-client editor's client is never disturbed by the look). Linux reads `/proc/net/tcp`
//! and `/proc/net/tcp6`; macOS asks libproc for the editor process's sockets
//! (`proc_pidinfo(PROC_PIDLISTFDS)`, then `proc_pidfdinfo` with `PROC_PIDFDSOCKETINFO` on
//! each); `None` elsewhere.

/// The TCP state number of ESTABLISHED in `/proc/net/tcp`.
const ESTABLISHED: &str = "01";

/// Where [`clients_of`] looks on this platform, for `doctor`; `None` where it cannot.
pub const SOURCE: Option<&str> = if cfg!(target_os = "linux") {
    Some("the kernel's TCP tables (/proc/net/tcp, /proc/net/tcp6)")
} else if cfg!(target_os = "macos") {
    Some("libproc (the editor process's sockets, proc_pidfdinfo)")
} else if cfg!(windows) {
    Some("the TCP tables with owning pids (GetExtendedTcpTable)")
} else {
    None
};

/// How many established connections the local server on `port` (in process `pid`) holds, not
/// counting the one whose client side is `except_client_port` (the broker's own link); `None`
/// when they cannot be looked up (another OS, `/proc` hidden, or the process not ours).
pub fn clients_of(pid: u32, port: u16, except_client_port: Option<u16>) -> Option<usize> {
    #[cfg(target_os = "macos")]
    {
        libproc::clients_of(pid, port, except_client_port)
    }
    #[cfg(windows)]
    {
        tcp_table::clients_of(pid, port, except_client_port)
    }
    #[cfg(not(any(target_os = "macos", windows)))]
    {
        let _ = pid;
        proc_net_clients(port, except_client_port)
    }
}

/// One established-or-not connection of the Windows TCP table, as [`count_rows`] reads it.
#[cfg(any(windows, test))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpRow {
    /// `MIB_TCP_STATE` (5 is established).
    pub state: u32,
    /// The local port, in host order.
    pub local_port: u16,
    /// The remote port, in host order.
    pub remote_port: u16,
    /// The owning process.
    pub pid: u32,
}

/// [`clients_of`] over the rows of the Windows TCP tables: established connections that
/// process `pid` holds on `port`, the broker's own (`except_client_port`) left out. A row
/// owned by pid 0 (the idle process: never a connection's on Windows; what wine reports for
/// every row) counts by its port alone, as Linux's `/proc/net/tcp` does.
#[cfg(any(windows, test))]
pub fn count_rows(rows: &[TcpRow], pid: u32, port: u16, except_client_port: Option<u16>) -> usize {
    const ESTABLISHED_STATE: u32 = 5;
    rows.iter()
        .filter(|r| {
            r.state == ESTABLISHED_STATE
                && (r.pid == pid || r.pid == 0)
                && r.local_port == port
                && Some(r.remote_port) != except_client_port
        })
        .count()
}

/// Windows' TCP tables with owning pids (`GetExtendedTcpTable`, IPv4 and IPv6).
#[cfg(windows)]
#[allow(unsafe_code)] // FFI to iphlpapi and reads of the tables it fills
mod tcp_table {
    use super::TcpRow;
    use windows_sys::Win32::NetworkManagement::IpHelper::{
        GetExtendedTcpTable, MIB_TCP6ROW_OWNER_PID, MIB_TCPROW_OWNER_PID,
        TCP_TABLE_OWNER_PID_CONNECTIONS,
    };

    const AF_INET: u32 = 2;
    const AF_INET6: u32 = 23;
    const ERROR_INSUFFICIENT_BUFFER: u32 = 122;

    /// The table of family `af` as bytes (u32 words, so its rows are aligned), or `None`.
    fn table(af: u32) -> Option<Vec<u32>> {
        let mut size = 0u32;
        for _ in 0..4 {
            let mut buf = vec![0u32; (size as usize).div_ceil(4).max(1)];
            let mut len = u32::try_from(buf.len() * 4).ok()?;
            // SAFETY: `buf` is writable for `len` bytes; the call writes at most that much
            // and says how much it needs when that is not enough.
            let r = unsafe {
                GetExtendedTcpTable(
                    buf.as_mut_ptr().cast(),
                    &mut len,
                    0,
                    af,
                    TCP_TABLE_OWNER_PID_CONNECTIONS,
                    0,
                )
            };
            match r {
                0 => return Some(buf),
                ERROR_INSUFFICIENT_BUFFER => size = len + 256,
                _ => return None,
            }
        }
        None
    }

    /// The rows of a filled table whose row type is `R`.
    fn rows<R>(buf: &[u32], read: impl Fn(&R) -> TcpRow) -> Vec<TcpRow> {
        let n = buf[0] as usize;
        let offset = std::mem::align_of::<R>().max(4);
        let room = (buf.len() * 4).saturating_sub(offset) / std::mem::size_of::<R>();
        let base = buf.as_ptr().cast::<u8>();
        (0..n.min(room))
            .map(|i| {
                // SAFETY: row `i` lies within `buf` (bounded by `room` above), which the OS
                // filled with `n` rows of `R` after the u32 count (rows aligned to `offset`).
                let row = unsafe { &*base.add(offset + i * std::mem::size_of::<R>()).cast::<R>() };
                read(row)
            })
            .collect()
    }

    fn port(raw: u32) -> u16 {
        // The port sits in the low 16 bits, in network byte order.
        u16::from_be((raw & 0xffff) as u16)
    }

    pub(super) fn clients_of(pid: u32, port_: u16, except: Option<u16>) -> Option<usize> {
        let mut all = Vec::new();
        let v4 = table(AF_INET);
        if let Some(b) = &v4 {
            all.extend(rows::<MIB_TCPROW_OWNER_PID>(b, |r| TcpRow {
                state: r.dwState,
                local_port: port(r.dwLocalPort),
                remote_port: port(r.dwRemotePort),
                pid: r.dwOwningPid,
            }));
        }
        let v6 = table(AF_INET6);
        if let Some(b) = &v6 {
            all.extend(rows::<MIB_TCP6ROW_OWNER_PID>(b, |r| TcpRow {
                state: r.dwState,
                local_port: port(r.dwLocalPort),
                remote_port: port(r.dwRemotePort),
                pid: r.dwOwningPid,
            }));
        }
        (v4.is_some() || v6.is_some()).then(|| super::count_rows(&all, pid, port_, except))
    }
}

/// [`clients_of`] from `/proc/net/tcp{,6}`, which hold every process's connections.
#[cfg_attr(any(target_os = "macos", windows), allow(dead_code))]
fn proc_net_clients(port: u16, except_client_port: Option<u16>) -> Option<usize> {
    let mut any = false;
    let mut n = 0;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        any = true;
        n += count_in(&text, port, except_client_port);
    }
    any.then_some(n)
}

/// [`clients_of`] over one table's text.
#[cfg_attr(windows, allow(dead_code))]
fn count_in(table: &str, port: u16, except_client_port: Option<u16>) -> usize {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let mut cols = line.split_whitespace().skip(1);
            let local = port_of(cols.next()?)?;
            let remote = port_of(cols.next()?)?;
            let state = cols.next()?;
            Some((local, remote, state == ESTABLISHED))
        })
        .filter(|&(local, remote, established)| {
            established && local == port && Some(remote) != except_client_port
        })
        .count()
}

/// The port of an `ADDR:PORT` column (both in hex).
#[cfg_attr(windows, allow(dead_code))]
fn port_of(column: &str) -> Option<u16> {
    let (_, hex) = column.rsplit_once(':')?;
    u16::from_str_radix(hex, 16).ok()
}

/// libproc's view of a process's sockets (XNU `bsd/sys/proc_info.h`). The structures are
/// written out here (the `libc` crate has only some of them), with their sizes checked by the
/// tests on every platform: the same fixed-width fields give the same layout on both Apple
/// targets (LP64) and on Linux.
#[cfg_attr(not(target_os = "macos"), allow(dead_code))]
#[allow(unsafe_code)] // FFI to libproc and reads of the kernel's plain structures
mod libproc {
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
        (tcp.tcpsi_state == TSI_S_ESTABLISHED && lport == port)
            .then(|| net(tcp.tcpsi_ini.insi_fport))
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
}

#[cfg(test)]
#[allow(unsafe_code)] // builds the kernel's plain structures
mod tests {
    use super::*;

    /// The Windows table: only established rows of the editor's process on its port count,
    /// the broker's own link left out (a listening row, another process's client on the same
    /// port number, a closed connection do not).
    #[test]
    fn the_windows_tcp_table_counts_the_editors_other_clients() {
        let row = |state, local_port, remote_port, pid| TcpRow {
            state,
            local_port,
            remote_port,
            pid,
        };
        let rows = [
            row(2, 4242, 0, 77),     // listening
            row(5, 4242, 50001, 77), // the broker's link
            row(5, 4242, 50002, 77), // Claude Code's
            row(5, 4242, 50003, 78), // another process, same port number (another address)
            row(5, 4242, 50005, 0),  // owner unknown (wine): counted by its port
            row(8, 4242, 50004, 77), // closing
            row(5, 50002, 4242, 90), // the client's own end
        ];
        assert_eq!(count_rows(&rows, 77, 4242, Some(50001)), 2);
        assert_eq!(count_rows(&rows, 77, 4242, None), 3);
        assert_eq!(count_rows(&rows, 78, 4242, Some(50001)), 2);
        assert_eq!(count_rows(&[], 77, 4242, None), 0);
    }

    /// The real table (Windows; under wine in CI): a client of our own listener is seen.
    #[cfg(windows)]
    #[test]
    fn a_client_of_our_listener_is_in_the_windows_table() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (_server_end, _) = listener.accept().unwrap();
        let own = client.local_addr().unwrap().port();
        let me = std::process::id();
        assert_eq!(clients_of(me, port, None), Some(1));
        assert_eq!(clients_of(me, port, Some(own)), Some(0));
    }

    /// A TCP socket as `PROC_PIDFDSOCKETINFO` describes it (ports in network order).
    fn tcp_socket(state: i32, local: u16, remote: u16) -> libproc::SocketFdInfo {
        // SAFETY: the structures are plain data; all-zero is a valid value of each.
        let mut info: libproc::SocketFdInfo = unsafe { std::mem::zeroed() };
        info.psi.soi_kind = libproc::SOCKINFO_TCP;
        // SAFETY: writing the TCP member of a zeroed union.
        let tcp = unsafe { &mut info.psi.soi_proto.pri_tcp };
        tcp.tcpsi_state = state;
        tcp.tcpsi_ini.insi_lport = i32::from(local.to_be());
        tcp.tcpsi_ini.insi_fport = i32::from(remote.to_be());
        info
    }

    #[test]
    fn libprocs_structures_have_the_kernels_sizes_and_offsets() {
        use std::mem::{offset_of, size_of};
        // XNU bsd/sys/proc_info.h on LP64: PROC_PIDFDSOCKETINFO_SIZE is 792 bytes.
        assert_eq!(size_of::<libproc::ProcFileInfo>(), 24);
        assert_eq!(size_of::<libproc::VinfoStat>(), 136);
        assert_eq!(size_of::<libproc::InSockInfo>(), 80);
        assert_eq!(size_of::<libproc::TcpSockInfo>(), 120);
        assert_eq!(size_of::<libproc::SocketInfo>(), 768);
        assert_eq!(size_of::<libproc::SocketFdInfo>(), 792);
        assert_eq!(offset_of!(libproc::SocketInfo, soi_kind), 232);
        assert_eq!(offset_of!(libproc::SocketInfo, soi_proto), 240);
        assert_eq!(offset_of!(libproc::TcpSockInfo, tcpsi_state), 80);
        assert_eq!(size_of::<libproc::ProcFdInfo>(), 8);
    }

    #[test]
    fn an_accepted_established_connection_names_its_client() {
        let est = libproc::TSI_S_ESTABLISHED;
        assert_eq!(
            libproc::accepted_from(&tcp_socket(est, 8080, 0xA001), 8080),
            Some(0xA001)
        );
        // The listener, a closing connection, another port, the client side: none count.
        assert_eq!(libproc::accepted_from(&tcp_socket(1, 8080, 0), 8080), None);
        assert_eq!(
            libproc::accepted_from(&tcp_socket(10, 8080, 0xA002), 8080),
            None
        );
        assert_eq!(
            libproc::accepted_from(&tcp_socket(est, 8081, 0xA001), 8080),
            None
        );
        assert_eq!(
            libproc::accepted_from(&tcp_socket(est, 0xA001, 8080), 8080),
            None
        );
        let mut unix = tcp_socket(est, 8080, 1);
        unix.psi.soi_kind = 3;
        assert_eq!(libproc::accepted_from(&unix, 8080), None);
    }

    const TABLE: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1F90 0100007F:A001 01 00000000:00000000 00:00000000 00000000  1000        0 2 1 0000000000000000 20 4 30 10 -1
   2: 0100007F:A001 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1000        0 3 1 0000000000000000 20 4 30 10 -1
   3: 0100007F:1F90 0100007F:A002 01 00000000:00000000 00:00000000 00000000  1000        0 4 1 0000000000000000 20 4 30 10 -1
   4: 0100007F:1F90 0100007F:A003 06 00000000:00000000 00:00000000 00000000  1000        0 5 1 0000000000000000 20 4 30 10 -1
";

    #[test]
    fn only_established_server_side_connections_of_the_port_count() {
        // 0x1F90 = 8080: the listener (0A) and a TIME_WAIT (06) do not count, nor the client
        // side of a connection (local port A001).
        assert_eq!(count_in(TABLE, 8080, None), 2);
        assert_eq!(count_in(TABLE, 8080, Some(0xA001)), 1);
        assert_eq!(count_in(TABLE, 8081, None), 0);
        assert_eq!(count_in("garbage\nmore garbage here x\n", 8080, None), 0);
    }

    #[test]
    fn a_real_connection_is_seen_and_its_end_too() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let me = std::process::id();
        let Some(before) = clients_of(me, port, None) else {
            return; // no /proc/net/tcp here
        };
        assert_eq!(before, 0);
        let client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (server, _) = listener.accept().unwrap();
        let mine = client.local_addr().unwrap().port();
        assert_eq!(clients_of(me, port, None), Some(1));
        assert_eq!(clients_of(me, port, Some(mine)), Some(0));
        drop(client);
        drop(server);
        assert_eq!(clients_of(me, port, None), Some(0));
    }
}
