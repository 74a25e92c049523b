//! The daemon and fake editors as real processes, with their output captured line by line.

use pi_ide_broker::testkit::within;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

/// The inodes of the sockets process `pid` (a number, or "self") has open, as its
/// `/proc/PID/fd` links name them (`socket:[123]`). Linux only: a missing `/proc` fails the
/// test instead of reading as none.
pub fn socket_inodes(pid: &str) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("/proc/PID/fd")
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|t| {
            let t = t.to_str()?;
            Some(t.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect()
}

/// The broker binary under test.
pub fn broker_bin() -> PathBuf {
    // PI_IDE_BROKER_TEST_BIN points the suite at another build of the same commit (the static
    // musl binary the npm package ships: issue 41).
    std::env::var_os("PI_IDE_BROKER_TEST_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_pi-ide-broker")))
}

/// An example binary built by `cargo test` (e.g. `fake_editor`).
pub fn example_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target dir");
    profile_dir.join("examples").join(name)
}

/// A child whose stdout/stderr lines are all kept and can be awaited.
pub struct Proc {
    pub child: Child,
    lines: mpsc::UnboundedReceiver<String>,
    /// Every line seen so far (stdout and stderr).
    pub seen: Vec<String>,
}

impl Proc {
    pub fn spawn(cmd: &mut Command) -> Proc {
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("spawn");
        let (tx, lines) = mpsc::unbounded_channel();
        if let Some(out) = child.stdout.take() {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut r = BufReader::new(out).lines();
                while let Ok(Some(l)) = r.next_line().await {
                    let _ = tx.send(l);
                }
            });
        }
        if let Some(err) = child.stderr.take() {
            tokio::spawn(async move {
                let mut r = BufReader::new(err).lines();
                while let Ok(Some(l)) = r.next_line().await {
                    let _ = tx.send(l);
                }
            });
        }
        Proc {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for a line containing every one of `needles`; returns it.
    pub async fn wait_line(&mut self, needles: &[&str]) -> String {
        if let Some(l) = self
            .seen
            .iter()
            .find(|l| needles.iter().all(|n| l.contains(n)))
        {
            return l.clone();
        }
        let what = format!("a line with {needles:?}");
        let lines = &mut self.lines;
        let seen = &mut self.seen;
        within(&what, async {
            loop {
                match lines.recv().await {
                    Some(l) => {
                        seen.push(l.clone());
                        if needles.iter().all(|n| l.contains(n)) {
                            return l;
                        }
                    }
                    None => panic!(
                        "process output ended before {what}; saw:\n{}",
                        seen.join("\n")
                    ),
                }
            }
        })
        .await
    }

    /// Sends a signal.
    pub fn signal(&self, sig: rustix::process::Signal) {
        let pid = self
            .child
            .id()
            .and_then(|p| rustix::process::Pid::from_raw(p as i32))
            .expect("pid");
        rustix::process::kill_process(pid, sig).expect("kill");
    }

    /// Waits for exit, then drains the remaining output into `seen`.
    pub async fn wait_exit(&mut self) -> std::process::ExitStatus {
        let status = within("process exit", self.child.wait())
            .await
            .expect("wait");
        while let Ok(Some(l)) =
            tokio::time::timeout(std::time::Duration::from_secs(2), self.lines.recv()).await
        {
            self.seen.push(l);
        }
        status
    }
}

/// Writes a config file pointing every path into `root`.
pub fn write_config(root: &Path, extra: &str) -> PathBuf {
    let cfg = root.join("config.toml");
    // The copilot door is on by default: never the real ~/.copilot.
    let copilot = if extra.contains("[copilot]") {
        String::new()
    } else {
        format!(
            "[copilot]\ndir = \"{r}/copilot-ide\"\neditor_dirs = [\"{r}/copilot-ide\"]\n",
            r = root.display()
        )
    };
    let text = format!(
        "socket = \"{r}/run/sock\"\nstate_dir = \"{r}/state\"\n{extra}\n{copilot}[compat]\nlock_dir = \"{r}/compat\"\n[gemini]\ndir = \"{r}/gemini\"\nqwen_dir = \"{r}/qwen-ide\"\n[codex]\nsocket = \"{r}/codex-ipc/ipc.sock\"\n[[lock_dirs]]\npath = \"{r}/pi-ide\"\nfamily = \"pi\"\n\n[[lock_dirs]]\npath = \"{r}/claude-ide\"\nfamily = \"claude\"\n",
        r = root.display()
    );
    std::fs::write(&cfg, text).expect("write config");
    cfg
}

/// Gives a child of the test its own HOME (under `root`) and no service-manager or lock-dir
/// variables of the test's own environment, so it never reads the real user's config or talks
/// to the real user's service manager.
pub fn isolate<'c>(cmd: &'c mut Command, root: &Path) -> &'c mut Command {
    let home = root.join("home");
    let _ = std::fs::create_dir_all(&home);
    cmd.env("HOME", &home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("XDG_STATE_HOME", home.join(".local/state"))
        .env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .env_remove("WATCHDOG_PID")
        .env_remove("PI_IDE_LOCK_DIR")
        .env_remove("COPILOT_HOME")
}

/// Kills, when dropped, the daemon recorded as running in `state_dir` (`running.json`): an
/// autostarted daemon is no child of the test, and a failed assert would leave it running.
pub struct DaemonReaper(pub PathBuf);

impl Drop for DaemonReaper {
    fn drop(&mut self) {
        let record = std::fs::read_to_string(self.0.join("running.json")).unwrap_or_default();
        let pid = serde_json::from_str::<serde_json::Value>(&record)
            .ok()
            .and_then(|v| v["pid"].as_i64())
            .and_then(|p| i32::try_from(p).ok())
            .and_then(rustix::process::Pid::from_raw);
        if let Some(pid) = pid {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
}

/// Starts the daemon process on `config`, logging everything, and waits for its ready line.
pub async fn start_daemon(config: &Path) -> Proc {
    start_daemon_logging(config, Some("trace")).await
}

/// [`start_daemon`] with `RUST_LOG` set to `filter`, or unset (the config's level).
pub async fn start_daemon_logging(config: &Path, filter: Option<&str>) -> Proc {
    let mut cmd = Command::new(broker_bin());
    cmd.arg("--config")
        .arg(config)
        .arg("daemon")
        .env_remove("RUST_LOG")
        .env_remove("PI_IDE_BROKER_SOCKET");
    if let Some(root) = config.parent() {
        isolate(&mut cmd, root);
    }
    if let Some(f) = filter {
        cmd.env("RUST_LOG", f);
    }
    let mut p = Proc::spawn(&mut cmd);
    p.wait_line(&["pi-ide-broker ready"]).await;
    p
}

/// Starts a fake editor process writing its lockfile into `dir`; returns it and its port.
pub async fn start_editor(dir: &Path, args: &[&str]) -> (Proc, u16) {
    let mut cmd = Command::new(example_bin("fake_editor"));
    cmd.arg("--dir").arg(dir).args(args);
    let mut p = Proc::spawn(&mut cmd);
    let line = p.wait_line(&["ready "]).await;
    let port = line
        .trim_start_matches("ready ")
        .trim()
        .parse()
        .expect("port");
    (p, port)
}

/// Runs `examples/connect_probe SOCKET` as uid 65534 (setpriv) and returns what it printed:
/// `connect-failed <errno>`, `dropped` or `answered <bytes>`. `None` when it cannot run. The
/// probe runs from a copy in a dir every user may enter, whatever the build dir's modes.
pub async fn probe_as_nobody(socket: &Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix("pi-ide-broker-probe")
        .tempdir_in("/tmp")
        .ok()?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).ok()?;
    let bin = dir.path().join("connect_probe");
    std::fs::copy(example_bin("connect_probe"), &bin).ok()?;
    let out = tokio::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&bin)
        .arg(socket)
        .output();
    let out = within("probe as another uid", out).await.ok()?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// True where another uid can be tried: root and `setpriv` (util-linux).
pub async fn other_uid_usable() -> bool {
    rustix::process::getuid().is_root()
        && probe_as_nobody(Path::new("/nonexistent"))
            .await
            .is_some_and(|o| o.starts_with("connect-failed"))
}

/// [`other_uid_usable`], or the test cannot run here (see [`super::cannot_run`]).
pub async fn other_uid_or_skip(test: &str) -> bool {
    let usable = other_uid_usable().await;
    if !usable {
        super::cannot_run(&format!(
            "{test}: needs root and setpriv (util-linux) to run a probe as uid 65534"
        ));
    }
    usable
}

/// Opens the broker's socket, and the dirs above it inside `root`, to other users (dirs 0711,
/// socket 0666), as a bind mount or an ssh forward hands it over; `open = false` closes them
/// again (0700, 0600).
pub fn expose_socket(socket: &Path, root: &Path, open: bool) {
    use std::os::unix::fs::PermissionsExt;
    let (dirs, sock) = if open { (0o711, 0o666) } else { (0o700, 0o600) };
    for d in socket
        .ancestors()
        .skip(1)
        .take_while(|p| p.starts_with(root))
    {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(dirs)).unwrap();
    }
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(sock)).unwrap();
}

/// Forwards a child's stderr, line by line, into the test's own output: the harness keeps it
/// and shows it only when the test fails (a passing run prints no child's stderr).
pub fn capture_stderr(child: &mut Child, label: &'static str) {
    if let Some(err) = child.stderr.take() {
        tokio::spawn(async move {
            let mut r = BufReader::new(err).lines();
            while let Ok(Some(l)) = r.next_line().await {
                eprintln!("[{label} stderr] {l}");
            }
        });
    }
}
