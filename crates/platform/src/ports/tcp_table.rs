//! Windows' TCP tables with owning pids (`GetExtendedTcpTable`, IPv4 and IPv6).

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
