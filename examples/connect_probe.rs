//! Connects to the broker's socket (a Unix socket; a named pipe on Windows), sends `GET /v1/status`, and reports exactly how far it got:
//! `connect-failed <errno>`, `dropped` (connected, then closed without an answer) or
//! `answered <bytes>`. The tests run it as another uid to check the broker's peer check.

use std::io::{Read, Write};

fn main() {
    let Some(path) = std::env::args().nth(1) else {
        println!("usage: connect_probe SOCKET");
        std::process::exit(2);
    };
    let mut s = match open(&path) {
        Ok(s) => s,
        Err(e) => {
            println!("connect-failed {}", e.raw_os_error().unwrap_or(0));
            return;
        }
    };
    let _ = s.write_all(b"GET /v1/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    if buf.is_empty() {
        println!("dropped");
    } else {
        println!("answered {}", buf.len());
    }
}

/// The socket, with a read timeout so a silent broker cannot hang the probe.
#[cfg(unix)]
fn open(path: &str) -> std::io::Result<std::os::unix::net::UnixStream> {
    let s = std::os::unix::net::UnixStream::connect(path)?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
    Ok(s)
}

/// The pipe, opened as a file (a pipe takes no read timeout; the tests bound the process).
#[cfg(windows)]
fn open(path: &str) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
}
