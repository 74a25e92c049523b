//! Who else holds a loopback port, and whose its listener is, read without connecting.
//!
//! The established connections a local server has accepted, looked up without connecting (so a
//! single-client editor's client is never disturbed by the look). Linux reads `/proc/net/tcp`
//! and `/proc/net/tcp6`; macOS asks libproc for the editor process's sockets
//! (`proc_pidinfo(PROC_PIDLISTFDS)`, then `proc_pidfdinfo` with `PROC_PIDFDSOCKETINFO` on
//! each); `None` elsewhere.
//!
//! Whose a port's listener is ([`listener_uids`], [`accepted_uids`]), so that an editor's token
//! goes to no other user's listener: Linux's `NETLINK_SOCK_DIAG` for one port's listeners (the
//! kernel walks its listening sockets only), else the `uid` column of the same tables; `None`
//! elsewhere.

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

/// The TCP state numbers of `/proc/net/tcp`'s `st` column: ESTABLISHED, SYN_RECV (a
/// connection in its listener's queue, not yet accepted), LISTEN.
const ROW_ESTABLISHED: u8 = 0x01;
const ROW_SYN_RECV: u8 = 0x03;
const ROW_LISTEN: u8 = 0x0A;

/// The uids of the sockets listening on `port` at an address that a dial of `127.0.0.1`
/// reaches or that is loopback (127.0.0.1, ::1, the wildcards 0.0.0.0 and ::, and their
/// v4-mapped forms), each once; empty when nothing listens. `None` where the kernel's table
/// cannot be read (not Linux, or `/proc` hidden): the caller cannot tell whose it is.
pub fn listener_uids(port: u16) -> Option<Vec<u32>> {
    // Asked on every read of a lockfile: a read of `/proc/net/tcp` formats every socket of
    // the machine (tens of milliseconds on a busy one), the netlink query does not.
    #[cfg(target_os = "linux")]
    if let Some(rows) = sock_diag::listeners(port) {
        let pick = listening_on(port);
        return Some(sorted_uids(rows.iter().filter(|r| pick(r)).map(|r| r.uid)));
    }
    uids_in_tables(listening_on(port))
}

/// [`listener_uids`]'s rows.
fn listening_on(port: u16) -> impl Fn(&Row) -> bool {
    move |row| {
        row.state == ROW_LISTEN && row.local.port() == port && reaches_loopback(row.local.ip())
    }
}

/// The uids of the server end of our connection from `client_port` to a loopback `port`:
/// accepted or still in the listener's queue, its row carries its listener's uid (the
/// kernel gives an accepted socket its listener's owner, and shows a queued one with its
/// listener's). Unlike [`listener_uids`], it names the very socket we reached, even once
/// that listener is closed. `None` where the table cannot be read.
pub fn accepted_uids(port: u16, client_port: u16) -> Option<Vec<u32>> {
    uids_in_tables(accepted_from(port, client_port))
}

/// [`accepted_uids`]'s rows.
fn accepted_from(port: u16, client_port: u16) -> impl Fn(&Row) -> bool {
    move |row| {
        matches!(row.state, ROW_ESTABLISHED | ROW_SYN_RECV)
            && row.local.port() == port
            && row.remote.port() == client_port
            && reaches_loopback(row.remote.ip())
    }
}

/// The uids of the rows that `pick` picks, in `/proc/net/tcp` and `/proc/net/tcp6`.
fn uids_in_tables(pick: impl Fn(&Row) -> bool) -> Option<Vec<u32>> {
    if !cfg!(target_os = "linux") {
        return None;
    }
    let mut any = false;
    let mut uids = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        any = true;
        uids.extend(uids_in(&text, &pick));
    }
    any.then(|| sorted_uids(uids))
}

/// Each uid once, in order.
fn sorted_uids(uids: impl IntoIterator<Item = u32>) -> Vec<u32> {
    let mut uids: Vec<u32> = uids.into_iter().collect();
    uids.sort_unstable();
    uids.dedup();
    uids
}

/// Linux's `NETLINK_SOCK_DIAG` (inet_diag, as `ss` asks it): the TCP sockets listening on one
/// port, IPv4 and IPv6, with their owners' uids. `None` when netlink is refused (a sandbox)
/// or answers what we cannot read: the caller falls back to `/proc/net/tcp`.
#[cfg(target_os = "linux")]
mod sock_diag {
    use super::Row;
    use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

    /// `SOCK_DIAG_BY_FAMILY`, the request and answer type.
    const SOCK_DIAG_BY_FAMILY: u16 = 20;
    const NLM_F_REQUEST: u16 = 0x1;
    const NLM_F_DUMP: u16 = 0x300;
    const NLMSG_ERROR: u16 = 2;
    const NLMSG_DONE: u16 = 3;
    const AF_INET: u8 = 2;
    const AF_INET6: u8 = 10;
    const IPPROTO_TCP: u8 = 6;
    /// `TCP_LISTEN`, a bit of `idiag_states`.
    const TCP_LISTEN: u32 = 10;
    /// `struct nlmsghdr`.
    const HEADER: usize = 16;
    /// `struct inet_diag_req_v2`.
    const REQUEST: usize = 56;
    /// `struct inet_diag_msg` (attributes may follow).
    const ANSWER: usize = 72;

    /// The listening TCP sockets on `port`, both families.
    pub(super) fn listeners(port: u16) -> Option<Vec<Row>> {
        let fd = rustix::net::socket_with(
            AddressFamily::NETLINK,
            SocketType::DGRAM,
            SocketFlags::CLOEXEC,
            Some(rustix::net::netlink::SOCK_DIAG),
        )
        .ok()?;
        // The kernel answers at once; the bound is for a kernel that never does.
        rustix::net::sockopt::set_socket_timeout(
            &fd,
            rustix::net::sockopt::Timeout::Recv,
            Some(std::time::Duration::from_secs(1)),
        )
        .ok()?;
        let mut rows = Vec::new();
        for (seq, family) in [(1, AF_INET), (2, AF_INET6)] {
            rustix::net::send(
                &fd,
                &listeners_request(seq, family, port),
                SendFlags::empty(),
            )
            .ok()?;
            read_dump(&fd, seq, &mut rows)?;
        }
        Some(rows)
    }

    /// A dump request for the sockets of `family` listening on `port`: the kernel filters a
    /// listener dump by its source port, and walks no connection when only `TCP_LISTEN` is
    /// asked for.
    pub(super) fn listeners_request(seq: u32, family: u8, port: u16) -> Vec<u8> {
        let mut r = Vec::with_capacity(HEADER + REQUEST);
        r.extend(((HEADER + REQUEST) as u32).to_ne_bytes());
        r.extend(SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        r.extend((NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
        r.extend(seq.to_ne_bytes());
        r.extend(0u32.to_ne_bytes());
        r.extend([family, IPPROTO_TCP, 0, 0]);
        r.extend((1u32 << TCP_LISTEN).to_ne_bytes());
        // inet_diag_sockid: the source port (network order), then nothing asked for.
        r.extend(port.to_be_bytes());
        r.resize(HEADER + REQUEST, 0);
        r
    }

    /// Reads the answers to dump `seq` into `rows`, until its end.
    fn read_dump(fd: &rustix::fd::OwnedFd, seq: u32, rows: &mut Vec<Row>) -> Option<()> {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let (got, whole) = rustix::net::recv(fd, &mut buf[..], RecvFlags::empty()).ok()?;
            if whole > got {
                return None; // cut short: not all of it can be read
            }
            if parse(buf.get(..got)?, seq, rows)? {
                return Some(());
            }
        }
    }

    /// The messages of one datagram for dump `seq` into `rows`: `Some(true)` at the dump's
    /// end, `None` on an error or a message we cannot read.
    pub(super) fn parse(mut datagram: &[u8], seq: u32, rows: &mut Vec<Row>) -> Option<bool> {
        while datagram.len() >= HEADER {
            let u32_at = |b: &[u8], i: usize| -> Option<u32> {
                Some(u32::from_ne_bytes(b.get(i..i + 4)?.try_into().ok()?))
            };
            let len = usize::try_from(u32_at(datagram, 0)?).ok()?;
            let kind = u16::from_ne_bytes(datagram.get(4..6)?.try_into().ok()?);
            let msg = datagram.get(HEADER..len)?;
            if u32_at(datagram, 8)? == seq {
                match kind {
                    NLMSG_DONE => return Some(true),
                    NLMSG_ERROR => return None,
                    SOCK_DIAG_BY_FAMILY => rows.push(row(msg)?),
                    _ => {}
                }
            }
            // Each message is padded to 4 bytes.
            datagram = datagram.get(len.checked_add(3)? & !3..).unwrap_or_default();
        }
        Some(false)
    }

    /// One `struct inet_diag_msg`.
    fn row(msg: &[u8]) -> Option<Row> {
        let msg = msg.get(..ANSWER)?;
        let port = |i: usize| u16::from_be_bytes([msg[i], msg[i + 1]]);
        let addr = |i: usize| -> Option<IpAddr> {
            Some(match msg[0] {
                AF_INET => Ipv4Addr::from(<[u8; 4]>::try_from(&msg[i..i + 4]).ok()?).into(),
                AF_INET6 => Ipv6Addr::from(<[u8; 16]>::try_from(&msg[i..i + 16]).ok()?).into(),
                _ => return None,
            })
        };
        Some(Row {
            local: SocketAddr::new(addr(8)?, port(4)),
            remote: SocketAddr::new(addr(24)?, port(6)),
            state: msg[1],
            uid: u32::from_ne_bytes(msg[64..68].try_into().ok()?),
        })
    }
}

/// The uids of the rows of one table's text that `pick` picks.
fn uids_in(table: &str, pick: &impl Fn(&Row) -> bool) -> Vec<u32> {
    table
        .lines()
        .skip(1)
        .filter_map(Row::parse)
        .filter(|r| pick(r))
        .map(|r| r.uid)
        .collect()
}

/// One row of `/proc/net/tcp{,6}`: `sl local rem st tx:rx tr:when retrnsmt uid …`.
struct Row {
    local: std::net::SocketAddr,
    remote: std::net::SocketAddr,
    state: u8,
    uid: u32,
}

impl Row {
    fn parse(line: &str) -> Option<Row> {
        let mut cols = line.split_whitespace().skip(1);
        let local = socket_addr(cols.next()?)?;
        let remote = socket_addr(cols.next()?)?;
        let state = u8::from_str_radix(cols.next()?, 16).ok()?;
        let uid = cols.nth(3)?.parse().ok()?;
        Some(Row {
            local,
            remote,
            state,
            uid,
        })
    }
}

/// An `ADDR:PORT` column: the address as the kernel prints it (each 32-bit word of it in
/// hex, in this machine's byte order), the port in hex.
fn socket_addr(column: &str) -> Option<std::net::SocketAddr> {
    let (addr, port) = column.rsplit_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        let hex = addr.get(i * 8..i * 8 + 8)?;
        Some(u32::from_str_radix(hex, 16).ok()?.to_ne_bytes())
    };
    let ip: std::net::IpAddr = match addr.len() {
        8 => std::net::Ipv4Addr::from(word(0)?).into(),
        32 => {
            let mut bytes = [0u8; 16];
            for (i, chunk) in bytes.chunks_exact_mut(4).enumerate() {
                chunk.copy_from_slice(&word(i)?);
            }
            std::net::Ipv6Addr::from(bytes).into()
        }
        _ => return None,
    };
    Some(std::net::SocketAddr::new(ip, port))
}

/// 127.0.0.1, ::1, 0.0.0.0, ::, or a v4-mapped 127.0.0.1 or 0.0.0.0.
fn reaches_loopback(ip: std::net::IpAddr) -> bool {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let v4 = |a: Ipv4Addr| a == Ipv4Addr::LOCALHOST || a.is_unspecified();
    match ip {
        IpAddr::V4(a) => v4(a),
        IpAddr::V6(a) => {
            a == Ipv6Addr::LOCALHOST || a.is_unspecified() || a.to_ipv4_mapped().is_some_and(v4)
        }
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

    /// A row of `/proc/net/tcp{,6}` as this machine's kernel prints it: each 32-bit word of
    /// the address in hex, in the machine's byte order.
    fn row(local: std::net::SocketAddr, remote: std::net::SocketAddr, st: u8, uid: u32) -> String {
        let hex = |a: std::net::SocketAddr| {
            let bytes = match a.ip() {
                std::net::IpAddr::V4(v4) => v4.octets().to_vec(),
                std::net::IpAddr::V6(v6) => v6.octets().to_vec(),
            };
            let words: String = bytes
                .chunks_exact(4)
                .map(|w| format!("{:08X}", u32::from_ne_bytes([w[0], w[1], w[2], w[3]])))
                .collect();
            format!("{words}:{:04X}", a.port())
        };
        format!(
            "   0: {} {} {st:02X} 00000000:00000000 00:00000000 00000000 {uid:>5}        0 1 1 \
             0000000000000000 100 0 0 10 0",
            hex(local),
            hex(remote)
        )
    }

    /// Listeners on 127.0.0.1, ::1 and the wildcards count (each uid once); one on another
    /// loopback address or port, a connection, a half-closed socket do not. The server end
    /// of one connection is found by its client's port, whether accepted or still queued.
    #[test]
    fn the_uids_of_a_ports_loopback_listeners_and_of_one_accepted_connection() {
        let a = |s: &str| s.parse::<std::net::SocketAddr>().unwrap();
        let none4 = a("0.0.0.0:0");
        let none6 = a("[::]:0");
        let v4 = [
            row(a("127.0.0.1:8080"), none4, 0x0A, 1000),
            row(a("0.0.0.0:8080"), none4, 0x0A, 1001),
            row(a("127.0.0.2:8080"), none4, 0x0A, 1002),
            row(a("127.0.0.1:8081"), none4, 0x0A, 1003),
            row(a("192.168.1.5:8080"), none4, 0x0A, 1004),
            row(a("127.0.0.1:8080"), a("127.0.0.1:40001"), 0x01, 1005),
            row(a("127.0.0.1:8080"), a("127.0.0.1:40002"), 0x03, 1006),
            row(a("127.0.0.1:8080"), a("127.0.0.1:40003"), 0x06, 1007),
            row(a("127.0.0.1:40001"), a("127.0.0.1:8080"), 0x01, 1008),
        ];
        let v6 = [
            row(a("[::1]:8080"), none6, 0x0A, 1010),
            row(a("[::]:8080"), none6, 0x0A, 1001),
            row(a("[::ffff:127.0.0.1]:8080"), none6, 0x0A, 1011),
            row(a("[fe80::1]:8080"), none6, 0x0A, 1012),
            row(a("[::1]:8080"), a("[::ffff:127.0.0.1]:40009"), 0x01, 1013),
        ];
        let head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   \
                    uid  timeout inode\n";
        let tcp = format!("{head}{}\n", v4.join("\n"));
        let tcp6 = format!("{head}{}\n", v6.join("\n"));
        let both = |pick: &dyn Fn(&Row) -> bool| {
            let mut uids = uids_in(&tcp, &pick);
            uids.extend(uids_in(&tcp6, &pick));
            uids.sort_unstable();
            uids.dedup();
            uids
        };
        assert_eq!(both(&listening_on(8080)), vec![1000, 1001, 1010, 1011]);
        assert_eq!(both(&listening_on(8081)), vec![1003]);
        assert_eq!(both(&listening_on(8082)), Vec::<u32>::new());
        assert_eq!(both(&accepted_from(8080, 40001)), vec![1005]);
        assert_eq!(both(&accepted_from(8080, 40002)), vec![1006], "queued");
        assert_eq!(both(&accepted_from(8080, 40003)), Vec::<u32>::new());
        assert_eq!(both(&accepted_from(8080, 40009)), vec![1013]);
        assert!(uids_in("garbage\n0: x y z\n", &listening_on(8080)).is_empty());
    }

    /// A netlink answer as the kernel writes it: two listeners (IPv4 on 127.0.0.1, IPv6 on
    /// ::), another dump's message, then the end; an error ends the dump with nothing.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_sock_diag_answer_is_read_message_by_message() {
        let request = sock_diag::listeners_request(7, 2, 8080);
        assert_eq!(request.len(), 72);
        assert_eq!(&request[0..4], &72u32.to_ne_bytes());
        assert_eq!(
            &request[24..26],
            &8080u16.to_be_bytes(),
            "the source port asked for"
        );
        let message = |kind: u16, seq: u32, body: &[u8]| {
            let mut m = Vec::new();
            m.extend((16 + body.len() as u32).to_ne_bytes());
            m.extend(kind.to_ne_bytes());
            m.extend(2u16.to_ne_bytes()); // NLM_F_MULTI
            m.extend(seq.to_ne_bytes());
            m.extend(0u32.to_ne_bytes());
            m.extend(body);
            while m.len() % 4 != 0 {
                m.push(0);
            }
            m
        };
        let listener = |family: u8, addr: &[u8], uid: u32| {
            let mut d = vec![family, 0x0A, 0, 0];
            d.extend(8080u16.to_be_bytes());
            d.extend(0u16.to_be_bytes());
            let mut src = addr.to_vec();
            src.resize(16, 0);
            d.extend(src);
            d.extend([0u8; 16 + 4 + 8 + 12]);
            d.extend(uid.to_ne_bytes());
            d.extend(0u32.to_ne_bytes());
            assert_eq!(d.len(), 72);
            d.extend([8, 0, 1, 0, 0, 0, 0, 0]); // an attribute after it, skipped
            d
        };
        let mut datagram = message(20, 7, &listener(2, &[127, 0, 0, 1], 1000));
        datagram.extend(message(20, 7, &listener(10, &[0; 16], 1001)));
        datagram.extend(message(20, 6, &listener(2, &[127, 0, 0, 1], 1002)));
        let mut rows = Vec::new();
        assert_eq!(sock_diag::parse(&datagram, 7, &mut rows), Some(false));
        datagram = message(3, 7, &[0; 4]);
        assert_eq!(sock_diag::parse(&datagram, 7, &mut rows), Some(true));
        let got: Vec<(String, u8, u32)> = rows
            .iter()
            .map(|r| (r.local.to_string(), r.state, r.uid))
            .collect();
        assert_eq!(
            got,
            vec![
                ("127.0.0.1:8080".to_string(), 0x0A, 1000),
                ("[::]:8080".to_string(), 0x0A, 1001)
            ]
        );
        let error = message(2, 7, &(-2i32).to_ne_bytes());
        assert_eq!(sock_diag::parse(&error, 7, &mut rows), None);
        assert_eq!(sock_diag::parse(&[1, 2, 3], 7, &mut rows), Some(false));
        let short = message(20, 7, &[2, 0x0A]);
        assert_eq!(sock_diag::parse(&short, 7, &mut rows), None, "cut short");
    }

    /// The kernel's own table: our listener is ours, uid 65534's is 65534's, and so is the
    /// server end of our connection to it (not accepted yet).
    #[cfg(target_os = "linux")]
    #[test]
    fn whose_a_real_listener_is() {
        let me = crate::platform::user::uid();
        let mine = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = mine.local_addr().unwrap().port();
        let Some(uids) = listener_uids(port) else {
            crate::platform::process::other_uid::cannot_run(
                "whose_a_real_listener_is",
                "/proc/net/tcp",
            );
            return;
        };
        assert_eq!(uids, vec![me]);
        let client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let from = client.local_addr().unwrap().port();
        assert_eq!(accepted_uids(port, from), Some(vec![me]));
        drop(client);
        drop(mine);
        assert_eq!(listener_uids(port), Some(vec![]));
        let Some((_theirs, port)) =
            crate::platform::process::other_uid::listener("whose_a_real_listener_is")
        else {
            return;
        };
        let nobody = crate::platform::process::other_uid::NOBODY;
        assert_eq!(listener_uids(port), Some(vec![nobody]));
        // Netlink's answer (what `listener_uids` asks first) and the table's agree.
        let by_netlink =
            sock_diag::listeners(port).map(|rows| sorted_uids(rows.iter().map(|r| r.uid)));
        assert_eq!(by_netlink, Some(vec![nobody]), "netlink answers here");
        assert_eq!(uids_in_tables(listening_on(port)), Some(vec![nobody]));
        let client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let from = client.local_addr().unwrap().port();
        assert_eq!(accepted_uids(port, from), Some(vec![nobody]));
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
