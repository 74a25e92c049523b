//! Who else holds a loopback port: the established connections a local server has accepted,
//! read from `/proc/net/tcp` and `/proc/net/tcp6` without connecting (so a single-client
//! editor's client is never disturbed by the look). Linux only; `None` elsewhere.

/// The TCP state number of ESTABLISHED in `/proc/net/tcp`.
const ESTABLISHED: &str = "01";

/// How many established connections the local server on `port` holds, not counting the one
/// whose client side is `except_client_port` (the broker's own link); `None` when the kernel
/// tables cannot be read (not Linux, or `/proc` hidden).
pub fn clients_of(port: u16, except_client_port: Option<u16>) -> Option<usize> {
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
fn port_of(column: &str) -> Option<u16> {
    let (_, hex) = column.rsplit_once(':')?;
    u16::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let Some(before) = clients_of(port, None) else {
            return; // no /proc/net/tcp here
        };
        assert_eq!(before, 0);
        let client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (server, _) = listener.accept().unwrap();
        let mine = client.local_addr().unwrap().port();
        assert_eq!(clients_of(port, None), Some(1));
        assert_eq!(clients_of(port, Some(mine)), Some(0));
        drop(client);
        drop(server);
        assert_eq!(clients_of(port, None), Some(0));
    }
}
