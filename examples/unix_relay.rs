//! Relays every connection made to a Unix socket it listens on to another Unix socket, both
//! ways. Run in other namespaces (`unshare --mount`), its connections to the target come from
//! there, as a container's do through a socket mounted into it: the tests use it to check the
//! rights a door gives such a peer. Prints `ready` once it listens.

#[cfg(unix)]
fn main() {
    use std::io::Write;
    use std::os::unix::net::{UnixListener, UnixStream};
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(target)) = (args.next(), args.next()) else {
        println!("usage: unix_relay LISTEN TARGET");
        std::process::exit(2);
    };
    let _ = std::fs::remove_file(&listen);
    let listener = match UnixListener::bind(&listen) {
        Ok(l) => l,
        Err(e) => {
            println!("bind-failed {e}");
            std::process::exit(1);
        }
    };
    println!("ready");
    let _ = std::io::stdout().flush();
    for client in listener.incoming().flatten() {
        let Ok(upstream) = UnixStream::connect(&target) else {
            continue;
        };
        if let (Ok(c2), Ok(u2)) = (client.try_clone(), upstream.try_clone()) {
            pipe(client, u2);
            pipe(upstream, c2);
        }
    }
}

/// Copies `from` to `to` on a thread of its own; at its end, `to` is shut for writing.
#[cfg(unix)]
fn pipe(mut from: std::os::unix::net::UnixStream, mut to: std::os::unix::net::UnixStream) {
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut from, &mut to);
        let _ = to.shutdown(std::net::Shutdown::Write);
    });
}

#[cfg(not(unix))]
fn main() {
    println!("unix_relay: Unix sockets only");
    std::process::exit(2);
}
