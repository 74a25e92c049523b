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

#[cfg(windows)]
#[allow(unsafe_code)] // FFI to iphlpapi and reads of the tables it fills
mod tcp_table;

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

#[cfg(target_os = "linux")]
mod sock_diag;

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

#[cfg_attr(not(target_os = "macos"), allow(dead_code))]
#[allow(unsafe_code)] // FFI to libproc and reads of the kernel's plain structures
mod libproc;

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
        let me = crate::user::uid();
        let mine = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = mine.local_addr().unwrap().port();
        let Some(uids) = listener_uids(port) else {
            crate::process::other_uid::cannot_run("whose_a_real_listener_is", "/proc/net/tcp");
            return;
        };
        assert_eq!(uids, vec![me]);
        let client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let from = client.local_addr().unwrap().port();
        assert_eq!(accepted_uids(port, from), Some(vec![me]));
        drop(client);
        drop(mine);
        assert_eq!(listener_uids(port), Some(vec![]));
        let Some((_theirs, port)) = crate::process::other_uid::listener("whose_a_real_listener_is")
        else {
            return;
        };
        let nobody = crate::process::other_uid::NOBODY;
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
