//! This repository served over `git daemon` on 127.0.0.1, as a user's `git:` source: a bare
//! clone of the committed `HEAD` (what a fresh clone in CI has). The test holds the listening
//! socket itself, on a port the kernel picked, and runs `git daemon --inetd` on each
//! connection (as inetd would): no port is chosen and let go, no wait for a daemon to listen.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use tokio::net::TcpListener;
use tokio::process::Command;

/// `git daemon` exporting `local/pi-ide-broker.git`, one process per connection.
pub struct GitServer {
    _dir: tempfile::TempDir,
    /// Accepts connections and runs a daemon on each; aborted (its daemons killed) on drop.
    accepting: tokio::task::JoinHandle<()>,
    /// `git://127.0.0.1:<port>/local/pi-ide-broker.git`.
    pub url: String,
    /// The commit it serves as `HEAD`.
    pub head: String,
}

/// Whether `git daemon` exists here (Debian's `git` has it; some builds split it out).
pub fn git_daemon_available() -> bool {
    let exec = std::process::Command::new("git")
        .arg("--exec-path")
        .output();
    match exec {
        Ok(o) if o.status.success() => {
            let dir = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim().to_string());
            dir.join("git-daemon").exists()
        }
        _ => false,
    }
}

impl GitServer {
    /// Clones the repository's `HEAD` bare and serves it (listening before this returns).
    pub async fn start() -> GitServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let base = dir.path().join("srv");
        let repo = base.join("local").join("pi-ide-broker.git");
        let clone = std::process::Command::new("git")
            .args(["clone", "--quiet", "--bare"])
            .arg(env!("CARGO_MANIFEST_DIR"))
            .arg(&repo)
            .output()
            .expect("run git clone");
        assert!(
            clone.status.success(),
            "git clone --bare failed: {}",
            String::from_utf8_lossy(&clone.stderr)
        );
        let head = std::process::Command::new("git")
            .args(["rev-parse", "HEAD"])
            .current_dir(&repo)
            .output()
            .expect("git rev-parse");
        let head = String::from_utf8_lossy(&head.stdout).trim().to_string();
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("listen on a free port");
        let port = listener.local_addr().expect("local addr").port();
        let log = dir.path().join("git-daemon.log");
        let accepting = tokio::spawn(serve(listener, base, log));
        GitServer {
            _dir: dir,
            accepting,
            url: format!("git://127.0.0.1:{port}/local/pi-ide-broker.git"),
            head,
        }
    }

    /// The source pi takes for it (`git:` then the URL: pi reads `git://…` alone as a path).
    pub fn pi_source(&self) -> String {
        format!("git:{}", self.url)
    }
}

impl Drop for GitServer {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// Runs `git daemon --inetd` on every connection `listener` accepts, its log appended to `log`.
async fn serve(listener: TcpListener, base: PathBuf, log: PathBuf) {
    let mut daemons = tokio::task::JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        match inetd(stream, &base, &log) {
            // Reaped when it ends; killed when the server is dropped.
            Ok(mut child) => _ = daemons.spawn(async move { child.wait().await }),
            Err(e) => eprintln!("git daemon --inetd could not start: {e}"),
        }
    }
}

/// One `git daemon` serving `stream` on its stdin and stdout.
fn inetd(
    stream: tokio::net::TcpStream,
    base: &Path,
    log: &Path,
) -> std::io::Result<tokio::process::Child> {
    let stream = stream.into_std()?;
    stream.set_nonblocking(false)?;
    let input = OwnedFd::from(stream);
    let output = input.try_clone()?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    Command::new("git")
        .args([
            "daemon",
            "--inetd",
            "--export-all",
            "--log-destination=stderr",
        ])
        .arg(format!("--base-path={}", base.display()))
        .arg(base)
        .stdin(Stdio::from(input))
        .stdout(Stdio::from(output))
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
}
