//! Loopback ports held closed, as a crashed editor's port is.

/// A loopback port nothing listens on, held for as long as the socket returned lives: bound,
/// never listening, so a connection to it is refused and no other test's listener takes it.
pub fn closed_port() -> (tokio::net::TcpSocket, u16) {
    let sock = tokio::net::TcpSocket::new_v4().expect("a TCP socket");
    sock.bind(([127, 0, 0, 1], 0).into())
        .expect("bind a free port");
    let port = sock.local_addr().expect("its port").port();
    (sock, port)
}

/// Holds `port` closed (see [`closed_port`]) once its listener is gone, as a crashed editor's
/// port is: `None` if another socket took it meanwhile.
pub fn hold_closed(port: u16) -> Option<tokio::net::TcpSocket> {
    let sock = tokio::net::TcpSocket::new_v4().ok()?;
    sock.set_reuseaddr(true).ok()?;
    sock.bind(([127, 0, 0, 1], port).into()).ok()?;
    Some(sock)
}

/// Whether a socket listens on loopback or any address at `port`, as the kernel's TCP tables
/// say (Linux); `None` where they cannot be read. Unlike [`hold_closed`], a client's outgoing
/// connection that happens to use the port as its own does not count.
pub fn listening(port: u16) -> Option<bool> {
    let mut found = false;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).ok()?;
        found |= text.lines().skip(1).any(|row| {
            let cols: Vec<&str> = row.split_whitespace().collect();
            let local_port = cols
                .get(1)
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            local_port == Some(port) && cols.get(3) == Some(&"0A")
        });
    }
    Some(found)
}
