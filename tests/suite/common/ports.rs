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
