//! This repository served over `git daemon` on 127.0.0.1, as a user's `git:` source: a bare
//! clone of the committed `HEAD` (what a fresh clone in CI has), on a free port.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::process::{Child, Command};

/// A running `git daemon` exporting `local/pi-ide-broker.git`.
pub struct GitServer {
    _dir: tempfile::TempDir,
    _daemon: Child,
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
    /// Clones the repository's `HEAD` bare and serves it; waits until the port answers.
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
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("git-daemon.log")).expect("log file");
        let daemon = Command::new("git")
            .arg("daemon")
            .args(["--reuseaddr", "--listen=127.0.0.1", "--export-all"])
            .arg(format!("--port={port}"))
            .arg(format!("--base-path={}", base.display()))
            .arg(&base)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("spawn git daemon");
        wait_listening(port, &dir.path().join("git-daemon.log")).await;
        GitServer {
            _dir: dir,
            _daemon: daemon,
            url: format!("git://127.0.0.1:{port}/local/pi-ide-broker.git"),
            head,
        }
    }

    /// The source pi takes for it (`git:` then the URL: pi reads `git://…` alone as a path).
    pub fn pi_source(&self) -> String {
        format!("git:{}", self.url)
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("local addr").port()
}

/// `git daemon` says nothing when it listens: connect until it accepts (bounded).
async fn wait_listening(port: u16, log: &Path) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            panic!(
                "git daemon did not listen on {port} within 30 s: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
