//! Linux's `NETLINK_SOCK_DIAG` (inet_diag, as `ss` asks it): the TCP sockets listening on one
//! port, IPv4 and IPv6, with their owners' uids. `None` when netlink is refused (a sandbox)
//! or answers what we cannot read: the caller falls back to `/proc/net/tcp`.

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
